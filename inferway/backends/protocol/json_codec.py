"""Open Inference Protocol JSON requests and responses <-> numpy.

JSON tensors carry flat or nested ``data`` (row-major); a tensor with ``binary_data_size``
takes its bytes from the binary extension instead, so one request may mix both.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from inferway.backends.protocol.binary_codec import decode_raw_tensor, encode_raw_tensor
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import (
    DATATYPES,
    InferInputError,
    datatype_of,
    parse_shape,
    shape_text,
    validate_input,
    validate_request_inputs,
)
from inferway.backends.serving.request import DecodedRequest, RequestedOutput

_orjson: ModuleType | None
try:  # ~10x faster than the standard library on tensors; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    _orjson = None

__all__ = [
    "decode_json_request",
    "decode_json_tensor",
    "encode_json_response",
    "parse_json_header",
]


def _flatten(name: str, data: Any, out: list[Any]) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(name, item, out)
    else:
        out.append(data)


def decode_json_tensor(name: str, datatype: str, shape: Sequence[int], data: Any) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) -> an array of ``shape`` and ``datatype``."""
    count = math.prod(shape)
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat: list[Any] = []
        _flatten(name, data, flat)
        if not all(isinstance(x, str) for x in flat):
            raise InferInputError(f"input '{name}': BYTES data must be strings")
        arr = np.array([x.encode() for x in flat], dtype=object)
    else:
        dtype = DATATYPES[datatype]
        try:
            natural = np.asarray(data)
        except ValueError as exc:
            raise InferInputError(f"input '{name}': data is not a regular array: {exc}") from None
        kind = natural.dtype.kind
        if natural.size and kind not in "biuf":
            raise InferInputError(f"input '{name}': {datatype} data must be numbers")
        if datatype == "BOOL" and natural.size and kind != "b":
            raise InferInputError(f"input '{name}': BOOL data must be true/false")
        if dtype.kind in "iu" and natural.size:
            if kind == "f":
                raise InferInputError(f"input '{name}': {datatype} data must be integers")
            info = np.iinfo(dtype)
            if natural.min() < info.min or natural.max() > info.max:
                raise InferInputError(
                    f"input '{name}': a value lies outside the {datatype} range "
                    f"[{info.min}, {info.max}]"
                )
        with np.errstate(over="ignore"):  # a value beyond the type's range: refused below
            arr = natural.astype(dtype, copy=False).reshape(-1)
        if dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
            raise InferInputError(
                f"input '{name}': JSON data must be finite {datatype} numbers (NaN, Infinity "
                "and numbers beyond the type's range, such as 1e400, are not JSON numbers; "
                "send such values with the binary extension)"
            )
    if arr.size != count:
        raise InferInputError(
            f"input '{name}': data holds {arr.size} values but shape {shape_text(shape)} "
            f"needs {count}"
        )
    return arr.reshape(tuple(shape))


def _loads_std(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferInputError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # the parser recurses per level: a bomb of nested lists
        raise InferInputError("request body is not valid JSON here: nested too deeply") from None


def parse_json_header(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, or InferInputError saying why it is not one."""
    if _orjson is None:
        value = _loads_std(raw)
    else:
        try:
            value = _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            # the standard library decides (it accepts NaN) and words the error
            value = _loads_std(raw)
    if not isinstance(value, dict):
        raise InferInputError("request body must be a JSON object")
    return value


def _dump_json(doc: dict[str, Any]) -> bytes:
    """Compact JSON. Every float in ``doc`` is finite (``_finite_json_data`` spells the
    others), so orjson and the standard library write the same text."""
    if _orjson is not None:
        encoded: bytes = _orjson.dumps(doc)
        return encoded
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _params(where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferInputError(f"{where}: parameters must be a JSON object")
    return value


def decode_json_request(
    header: Mapping[str, Any], binary: bytes, specs: Sequence[TensorSpec]
) -> DecodedRequest:
    """Decode and validate a JSON (+ binary extension) inference request for one model."""
    by_name = {s.name: s for s in specs}
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InferInputError("request must have a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for index, item in enumerate(raw_inputs):
        if not isinstance(item, dict):
            raise InferInputError(f"inputs[{index}] must be an object")
        name = item.get("name")
        if not isinstance(name, str):
            raise InferInputError(f"inputs[{index}] needs a string 'name'")
        if name in inputs:
            raise InferInputError(f"input '{name}' is given more than once")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise InferInputError(f"input '{name}' needs a string 'datatype'")
        shape = parse_shape(name, item.get("shape"))
        validate_input(name, datatype, shape, by_name)
        params = _params(f"input '{name}'", item.get("parameters"))
        size = params.get("binary_data_size")
        if size is not None:
            if "data" in item:
                raise InferInputError(f"input '{name}' has both 'data' and binary_data_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InferInputError(f"input '{name}': binary_data_size must be an integer >= 0")
            if offset + size > len(binary):
                raise InferInputError(
                    f"input '{name}': binary_data_size {size} runs past the end of the body "
                    f"({len(binary) - offset} binary bytes left)"
                )
            inputs[name] = decode_raw_tensor(name, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in item:
            inputs[name] = decode_json_tensor(name, datatype, shape, item["data"])
        else:
            raise InferInputError(f"input '{name}' has neither 'data' nor binary_data_size")
    if offset != len(binary):
        raise InferInputError(
            f"binary_data_size values sum to {offset} bytes but {len(binary)} bytes follow "
            "the JSON header"
        )
    validate_request_inputs(inputs, specs)
    parameters = _params("request", header.get("parameters"))
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InferInputError("request 'id' must be a string")
    outputs: tuple[RequestedOutput, ...] | None = None
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise InferInputError("'outputs' must be a list")
        requested = []
        for index, out in enumerate(header["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InferInputError(f"outputs[{index}] needs a string 'name'")
            binary_flag = _params(f"output '{out['name']}'", out.get("parameters")).get(
                "binary_data"
            )
            requested.append(
                RequestedOutput(out["name"], None if binary_flag is None else bool(binary_flag))
            )
        outputs = tuple(requested)
    return DecodedRequest(
        inputs=inputs,
        id=request_id,
        parameters=parameters,
        outputs=outputs,
        binary_output=bool(parameters.get("binary_data_output", False)),
    )


_NON_FINITE_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _json_data(array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if datatype_of(array) == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return flat.tolist()


def _finite_json_data(array: np.ndarray) -> list[Any]:
    """A float output holding NaN or an infinity: JSON has no such numbers (a bare ``NaN``
    makes the whole answer unreadable to a strict parser), so each is written as the string
    ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and every finite value as the number."""
    return [
        value if math.isfinite(value) else _NON_FINITE_TEXT[repr(value)]
        for value in array.reshape(-1).tolist()
    ]


_WIRE_DTYPES = {dt: name for name, dt in DATATYPES.items() if name != "BYTES"}
"""Numeric dtypes whose bytes go on the wire as they are (little-endian, as the protocol's)."""

_Layout = tuple[tuple[str, np.dtype, tuple[int, ...]], ...]


def encode_json_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray, bool | None]],
    binary_default: bool = False,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Response body and, when any output travels as binary, the JSON header's length."""
    if request_id is None and not parameters:
        layout = _binary_layout(outputs, binary_default)
        if layout is not None:  # the JSON head depends on nothing else: built once
            head = _binary_head(model_name, model_version, layout)
            return head + b"".join([array.tobytes() for _, array, _ in outputs]), len(head)
    return _encode_response(
        model_name=model_name,
        model_version=model_version,
        request_id=request_id,
        outputs=outputs,
        binary_default=binary_default,
        parameters=parameters,
    )


def _binary_layout(
    outputs: Sequence[tuple[str, np.ndarray, bool | None]], binary_default: bool
) -> _Layout | None:
    """(name, dtype, shape) of each output when every one is a numeric tensor sent as binary
    in the wire's byte order; None otherwise."""
    layout = []
    for name, array, binary in outputs:
        if not (binary_default if binary is None else binary) or array.dtype not in _WIRE_DTYPES:
            return None
        layout.append((name, array.dtype, array.shape))
    return tuple(layout) if layout else None


@functools.lru_cache(maxsize=256)
def _binary_head(model_name: str, model_version: str, layout: _Layout) -> bytes:
    """The JSON head of an all-binary answer, as ``_encode_response`` writes it."""
    entries = [
        {
            "name": name,
            "datatype": _WIRE_DTYPES[dtype],
            "shape": list(shape),
            "parameters": {"binary_data_size": math.prod(shape) * dtype.itemsize},
        }
        for name, dtype, shape in layout
    ]
    doc = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    return _dump_json(doc)


def _encode_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray, bool | None]],
    binary_default: bool,
    parameters: Mapping[str, Any] | None,
) -> tuple[bytes, int | None]:
    """``encode_json_response``'s every case: each output's entry built and encoded."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array, binary in outputs:
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(array),
            "shape": list(array.shape),
        }
        if binary_default if binary is None else binary:
            blob = encode_raw_tensor(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                entry["data"] = _finite_json_data(array)
            else:
                entry["data"] = _json_data(array)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = entries
    head = _dump_json(doc)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
