"""What a request body shows, as the dynamic metadata Envoy's routes match on.

Pure: bytes and a few headers in, a plain dict out (keys in xds/translate/features.py). Never
raises on a bad body: a body that is not JSON is ``json: false`` (and the routes decide, by
their ``on_malformed``), not an error. The rows of an Open Inference Protocol request are its
first input's ``shape[0]``; a binary-extension request (``Inference-Header-Content-Length``)
has its JSON header first, followed by raw tensor bytes, and only that header is parsed.

When the body is not a JSON object, or not an inference request, ``reason`` says why, with
where (the JSON parser's line and column; the missing or wrong part of
``inputs[0].shape``): an ``on_malformed: reject`` route answers it, so a client learns what to
fix. It never quotes the body.
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
    KEY_REASON,
    KEY_ROWS,
)

__all__ = [
    "BINARY_HEADER_LENGTH",
    "measure_body",
    "measure_bodyless",
    "not_an_inference_request",
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


def measure_bodyless(method: str | None = None) -> dict[str, Any]:
    """A request without a body (``method`` from its ``:method``): nothing to route on; not
    JSON. A ``GET`` is told apart from an empty ``POST``: the fix differs."""
    if method is not None and method.upper() in {"GET", "HEAD"}:
        reason = f"a {method.upper()} request has no body: send a POST with a JSON body"
    else:
        reason = "the request body is empty"
    return {KEY_INPUT_BYTES: 0, KEY_JSON: False, KEY_INFERENCE: False, KEY_REASON: reason}


def measure_body(
    body: bytes, fields: Sequence[str], *, json_length: int | None = None
) -> dict[str, Any]:
    """``json_length``: the binary extension's header length (None: the body is all JSON)."""
    out: dict[str, Any] = {KEY_INPUT_BYTES: len(body), KEY_JSON: False, KEY_INFERENCE: False}
    if not body:
        out[KEY_REASON] = "the request body is empty"
        return out
    part = body if json_length is None or json_length > len(body) else body[:json_length]
    try:
        document = orjson.loads(part)
    except orjson.JSONDecodeError as error:
        out[KEY_REASON] = _not_json(error, json_length, len(body))
        return out
    if not isinstance(document, dict):
        out[KEY_REASON] = f"the request body is JSON but not an object ({_kind(document)})"
        return out
    out[KEY_JSON] = True
    rows = rows_of(document)
    if rows is not None:
        out[KEY_INFERENCE] = True
        out[KEY_ROWS] = rows
    else:
        out[KEY_REASON] = not_an_inference_request(document)
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


def not_an_inference_request(document: dict[str, Any]) -> str:
    """Why :func:`rows_of` finds no rows: the first part of ``inputs[0].shape[0]`` that is
    missing or of the wrong kind."""
    inputs = document.get("inputs")
    if inputs is None:
        return "the JSON body has no 'inputs' (an inference request's inputs[0].shape)"
    if not isinstance(inputs, list):
        return f"'inputs' is {_kind(inputs)}, not a list of inputs"
    if not inputs:
        return "'inputs' is an empty list"
    if not isinstance(inputs[0], dict):
        return f"inputs[0] is {_kind(inputs[0])}, not an object"
    shape = inputs[0].get("shape")
    if shape is None:
        return "inputs[0] has no 'shape'"
    if not isinstance(shape, list):
        return f"inputs[0].shape is {_kind(shape)}, not a list"
    if not shape:
        return "inputs[0].shape is an empty list"
    return f"inputs[0].shape[0] is {_kind(shape[0])}, not a whole number of rows (0 or more)"


def _not_json(error: orjson.JSONDecodeError, json_length: int | None, size: int) -> str:
    """The parser's message and where (line, column); never the body's text."""
    where = f"line {error.lineno} column {error.colno}"
    if json_length is not None and json_length > size:
        return (
            f"Inference-Header-Content-Length is {json_length} but the body has {size} bytes; "
            f"the body is not JSON: {error.msg} at {where}"
        )
    part = "the JSON header (Inference-Header-Content-Length)" if json_length else "the body"
    return f"{part} is not JSON: {error.msg} at {where}"


def _kind(value: Any) -> str:
    """A JSON value's kind, as a client would name it: ``null``, ``a list``, ``an object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a negative number" if value < 0 else "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else "a value"


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
