"""Open Inference Protocol tensors <-> numpy, with every check a bad request needs.

Pure code shared by the HTTP and gRPC servers: JSON tensors (flat or nested ``data``, row-major),
the binary tensor data extension (``binary_data_size`` per tensor, ``Inference-Header-Content-
Length`` splitting JSON from raw bytes) and validation against the model's TensorSpecs. Every
rejection raises :class:`InferInputError` whose message says which tensor and what was wrong, so
the servers turn it into a 400 / INVALID_ARGUMENT without guessing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferway.backends.runners.base import TensorSpec

try:  # ~10x faster than the standard library on tensors; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    _orjson = None

__all__ = [
    "DATATYPES",
    "DecodedRequest",
    "InferInputError",
    "RequestedOutput",
    "datatype_of",
    "decode_json_request",
    "decode_json_tensor",
    "decode_raw_tensor",
    "encode_json_response",
    "encode_raw_tensor",
    "parse_json_header",
    "select_outputs",
    "split_binary_body",
    "validate_input",
    "validate_request_inputs",
]

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND_SIZE = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}


class InferInputError(ValueError):
    """The request is malformed or does not fit the model; the message names what and where."""


@dataclass(frozen=True)
class RequestedOutput:
    """One entry of the request's ``outputs``; ``binary`` None means "use the default"."""

    name: str
    binary: bool | None = None


@dataclass
class DecodedRequest:
    """An inference request after decoding and validation."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[RequestedOutput, ...] | None = None
    binary_output: bool = False


def datatype_of(array: np.ndarray) -> str:
    """The protocol datatype name of a numpy array (object/str/bytes arrays are BYTES)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_KIND_SIZE.get((array.dtype.kind, array.dtype.itemsize))
    if name is None:
        raise TypeError(f"numpy dtype {array.dtype} has no Open Inference Protocol datatype")
    return name


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _parse_shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise InferInputError(f"input '{name}': shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise InferInputError(f"input '{name}': shape {_shape_text(shape)} has a negative size")
    return tuple(shape)


def validate_input(
    name: str, datatype: str, shape: Sequence[int], specs: Mapping[str, TensorSpec]
) -> TensorSpec:
    """Check one input's name, datatype and shape (rank and fixed dims) against the model."""
    spec = specs.get(name)
    if spec is None:
        known = ", ".join(sorted(specs)) or "none"
        raise InferInputError(f"unknown input '{name}'; the model's inputs are: {known}")
    if datatype not in DATATYPES:
        raise InferInputError(f"input '{name}': unsupported datatype {datatype!r}")
    if datatype != spec.datatype:
        raise InferInputError(
            f"input '{name}': datatype {datatype} does not match the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape):
        raise InferInputError(
            f"input '{name}': shape {_shape_text(shape)} has rank {len(shape)}, the model "
            f"expects rank {len(spec.shape)} {_shape_text(spec.shape)}"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if want >= 0 and got != want:
            raise InferInputError(
                f"input '{name}': dimension {axis} is {got}, the model expects {want} "
                f"(model shape {_shape_text(spec.shape)})"
            )
    return spec


def validate_request_inputs(inputs: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> None:
    """Every model input present, and all inputs agree on the batch size (first dimension)."""
    missing = [s.name for s in specs if s.name not in inputs]
    if missing:
        raise InferInputError(f"missing input(s): {', '.join(missing)}")
    rows = {name: arr.shape[0] for name, arr in inputs.items() if arr.ndim > 0}
    if any(r == 0 for r in rows.values()):
        raise InferInputError("inputs must hold at least one row (first dimension is 0)")
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"{n}={r}" for n, r in rows.items())
        raise InferInputError(f"inputs disagree on the batch size (first dimension): {detail}")


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
        arr = natural.astype(dtype, copy=False).reshape(-1)
    if arr.size != count:
        raise InferInputError(
            f"input '{name}': data holds {arr.size} values but shape {_shape_text(shape)} "
            f"needs {count}"
        )
    return arr.reshape(tuple(shape))


def decode_raw_tensor(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> np.ndarray:
    """Little-endian, row-major bytes -> array. BYTES elements carry a 4-byte LE length prefix."""
    count = math.prod(shape)
    if datatype == "BYTES":
        view = memoryview(raw)
        items: list[bytes] = []
        pos = 0
        while pos < len(view):
            if pos + 4 > len(view):
                raise InferInputError(f"input '{name}': truncated BYTES length prefix")
            size = int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
            if pos + size > len(view):
                raise InferInputError(f"input '{name}': BYTES element overruns the tensor data")
            items.append(bytes(view[pos : pos + size]))
            pos += size
        if len(items) != count:
            raise InferInputError(
                f"input '{name}': raw data holds {len(items)} BYTES elements but shape "
                f"{_shape_text(shape)} needs {count}"
            )
        return np.array(items, dtype=object).reshape(tuple(shape))
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InferInputError(
            f"input '{name}': raw data is {len(raw)} bytes but shape {_shape_text(shape)} "
            f"of {datatype} needs {expected}"
        )
    arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))
    return arr if arr.flags.aligned else arr.copy()


def encode_raw_tensor(array: np.ndarray) -> bytes:
    """The inverse of :func:`decode_raw_tensor`."""
    if datatype_of(array) == "BYTES":
        parts: list[bytes] = []
        for item in array.reshape(-1):
            blob = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(blob).to_bytes(4, "little"))
            parts.append(blob)
        return b"".join(parts)
    dtype = DATATYPES[datatype_of(array)]
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def split_binary_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """Split a request body into its JSON header and the binary tensor data after it."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise InferInputError(
            f"Inference-Header-Content-Length must be an integer, got {header_length!r}"
        ) from None
    if length < 0 or length > len(body):
        raise InferInputError(
            f"Inference-Header-Content-Length is {length} but the body is only {len(body)} bytes"
        )
    return body[:length], body[length:]


def _loads_std(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InferInputError(f"request body is not valid JSON: {exc}") from None


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


def _dump_json(doc: dict[str, Any], finite: bool) -> bytes:
    """Compact JSON; the standard library when a float is not finite (it writes NaN and
    Infinity, where orjson would silently write null)."""
    if _orjson is not None and finite:
        return _orjson.dumps(doc)
    return json.dumps(doc, separators=(",", ":")).encode()


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
        shape = _parse_shape(name, item.get("shape"))
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


def select_outputs(
    results: Mapping[str, np.ndarray],
    requested: Sequence[RequestedOutput] | None,
    output_names: Sequence[str],
) -> list[tuple[str, np.ndarray, bool | None]]:
    """The outputs to return, in order, with each one's binary flag (None: use the default)."""
    if requested is None:
        names = [n for n in output_names if n in results] or list(results)
        return [(n, results[n], None) for n in names]
    chosen = []
    for out in requested:
        if out.name not in results:
            known = ", ".join(output_names or list(results))
            raise InferInputError(f"unknown output '{out.name}'; the model's outputs are: {known}")
        chosen.append((out.name, results[out.name], out.binary))
    return chosen


def _json_data(array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if datatype_of(array) == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return flat.tolist()


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
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    finite = True
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
            entry["data"] = _json_data(array)
            if finite and array.dtype.kind in "fc" and not np.isfinite(array).all():
                finite = False
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = entries
    head = _dump_json(doc, finite)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
