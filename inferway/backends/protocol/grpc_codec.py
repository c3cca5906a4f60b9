"""ModelInferRequest/Response <-> numpy: typed ``contents`` and ``raw_input_contents``.

Validation is ``input_validation``'s, shared with the JSON codec (same messages for the
same mistakes); this module only knows where the protocol buffers keep the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferway.backends.protocol import pb2
from inferway.backends.protocol.binary_codec import decode_raw_tensor, encode_raw_tensor
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import (
    DATATYPES,
    InferInputError,
    datatype_of,
    validate_input,
    validate_request_inputs,
)
from inferway.backends.serving.request import DecodedRequest, RequestedOutput

__all__ = ["decode_grpc_request", "encode_grpc_response", "parameter_value"]

# Which InferTensorContents field holds each datatype; FP16/BF16 have none (raw only).
_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(param: Any) -> Any:
    """The Python value of an InferParameter (None when unset)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _typed_tensor(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> np.ndarray:
    field = _TYPED_FIELD.get(datatype)
    if field is None:
        raise InferInputError(
            f"input '{name}': {datatype} has no typed contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InferInputError(
            f"input '{name}': contents.{field} holds {len(values)} values but shape "
            f"{list(shape)} needs {count}"
        )
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    dtype = DATATYPES[datatype]
    wide = np.asarray(values)
    if dtype.kind in "iu" and wide.size and wide.dtype.itemsize > dtype.itemsize:
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise InferInputError(
                f"input '{name}': a value lies outside the {datatype} range "
                f"[{info.min}, {info.max}]"
            )
    return wide.astype(dtype, copy=False).reshape(shape)


def decode_grpc_request(request: Any, specs: Sequence[TensorSpec]) -> DecodedRequest:
    """Decode and validate a ModelInferRequest for one model."""
    by_name = {s.name: s for s in specs}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InferInputError(
            f"raw_input_contents has {len(raw)} entries but the request has "
            f"{len(request.inputs)} inputs; give one per input, in order"
        )
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise InferInputError(f"input '{name}' is given more than once")
        shape = tuple(int(d) for d in tensor.shape)
        if any(d < 0 for d in shape):
            raise InferInputError(f"input '{name}': shape {list(shape)} has a negative size")
        validate_input(name, tensor.datatype, shape, by_name)
        if raw:
            if tensor.HasField("contents"):
                raise InferInputError(
                    f"input '{name}' has both contents and raw_input_contents; use one"
                )
            inputs[name] = decode_raw_tensor(name, tensor.datatype, shape, raw[index])
        else:
            inputs[name] = _typed_tensor(name, tensor.datatype, shape, tensor.contents)
    validate_request_inputs(inputs, specs)
    parameters = {k: parameter_value(v) for k, v in request.parameters.items()}
    outputs = None
    if request.outputs:
        outputs = tuple(
            RequestedOutput(
                o.name,
                None
                if "binary_data" not in o.parameters
                else bool(parameter_value(o.parameters["binary_data"])),
            )
            for o in request.outputs
        )
    return DecodedRequest(
        inputs=inputs,
        id=request.id or None,
        parameters=parameters,
        outputs=outputs,
        binary_output=bool(raw) or bool(parameters.get("binary_data_output", False)),
    )


def encode_grpc_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[tuple[str, np.ndarray, bool | None]],
    raw: bool,
    parameters: Mapping[str, Any] | None = None,
) -> Any:
    """A ModelInferResponse. Raw contents are all-or-nothing (raw_output_contents is indexed
    like ``outputs``), so a datatype without a typed field makes the whole answer raw."""
    response = pb2.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    use_raw = raw or any(datatype_of(a) not in _TYPED_FIELD for _, a, _ in outputs)
    for name, array, _binary in outputs:
        datatype = datatype_of(array)
        tensor = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if use_raw:
            response.raw_output_contents.append(encode_raw_tensor(array))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1)
            )
        else:
            getattr(tensor.contents, _TYPED_FIELD[datatype]).extend(array.reshape(-1).tolist())
    for key, value in (parameters or {}).items():
        param = response.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)
    return response
