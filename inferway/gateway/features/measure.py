"""What a request body shows, as the dynamic metadata Envoy's routes match on.

Pure: bytes and a few headers in, a plain dict out (keys in xds/translate/features.py). Never
raises on a bad body: a body that is not JSON is ``json: false`` (and the routes decide, by
their ``on_malformed``), not an error. The rows of an Open Inference Protocol request are its
first input's ``shape[0]``; a binary-extension request (``Inference-Header-Content-Length``)
has its JSON header first, followed by raw tensor bytes, and only that header is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from inferway.xds.translate.features import (
    KEY_FIELDS,
    KEY_INFERENCE,
    KEY_INPUT_BYTES,
    KEY_JSON,
    KEY_PRESENT,
    KEY_ROWS,
)

__all__ = [
    "BINARY_HEADER_LENGTH",
    "measure_body",
    "measure_bodyless",
    "parse_field_paths",
    "rows_of",
]

BINARY_HEADER_LENGTH = "inference-header-content-length"
"""KServe's binary tensor extension: the length of the JSON part at the body's start."""
_MISSING = object()


def parse_field_paths(value: str | None) -> tuple[str, ...]:
    """The router's field list from its gRPC metadata (a JSON list of dotted paths)."""
    if not value:
        return ()
    try:
        paths = json.loads(value)
    except ValueError:
        return ()
    return tuple(p for p in paths if isinstance(p, str)) if isinstance(paths, list) else ()


def measure_bodyless() -> dict[str, Any]:
    """A request without a body: nothing to route on; not JSON."""
    return {KEY_INPUT_BYTES: 0, KEY_JSON: False, KEY_INFERENCE: False}


def measure_body(
    body: bytes, fields: Sequence[str], *, json_length: int | None = None
) -> dict[str, Any]:
    """``json_length``: the binary extension's header length (None: the body is all JSON)."""
    out: dict[str, Any] = {KEY_INPUT_BYTES: len(body), KEY_JSON: False, KEY_INFERENCE: False}
    part = body if json_length is None or json_length > len(body) else body[:json_length]
    try:
        document = orjson.loads(part)
    except orjson.JSONDecodeError:
        return out
    if not isinstance(document, dict):
        return out
    out[KEY_JSON] = True
    rows = rows_of(document)
    if rows is not None:
        out[KEY_INFERENCE] = True
        out[KEY_ROWS] = rows
    values: dict[str, Any] = {}
    present: dict[str, bool] = {}
    for path in fields:
        value = _lookup(document, path)
        if value is _MISSING:
            continue
        present[path] = True
        if isinstance(value, str | bool | int | float):
            values[path] = (
                float(value) if isinstance(value, int) and not isinstance(value, bool) else value
            )
    if values:
        out[KEY_FIELDS] = values
    if present:
        out[KEY_PRESENT] = present
    return out


def rows_of(document: dict[str, Any]) -> int | None:
    """The OIP request's rows: its first input's ``shape[0]`` (None when there is none)."""
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs or not isinstance(inputs[0], dict):
        return None
    shape = inputs[0].get("shape")
    if not isinstance(shape, list) or not shape:
        return None
    rows = shape[0]
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        return None
    return rows


def _lookup(document: Any, path: str) -> Any:
    current = document
    for segment in path.split("."):
        if isinstance(current, dict):
            current = current.get(segment, _MISSING)
        elif isinstance(current, list) and segment.isascii() and segment.isdigit():
            index = int(segment)
            current = current[index] if index < len(current) else _MISSING
        else:
            return _MISSING
        if current is _MISSING:
            return _MISSING
    return current
