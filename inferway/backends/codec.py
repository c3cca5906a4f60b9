"""Open Inference Protocol tensors <-> numpy, with every check a bad request needs.

Pure code shared by the HTTP and gRPC servers: JSON tensors (flat or nested ``data``, row-major),
the binary tensor data extension (``binary_data_size`` per tensor, ``Inference-Header-Content-
Length`` splitting JSON from raw bytes) and validation against the model's TensorSpecs. Every
rejection raises :class:`InferInputError` whose message says which tensor and what was wrong, so
the servers turn it into a 400 / INVALID_ARGUMENT without guessing.

This module is the codec's public surface in one import; the code lives in
:mod:`~inferway.backends.input_validation`, :mod:`~inferway.backends.inference_request`,
:mod:`~inferway.backends.binary_codec` and :mod:`~inferway.backends.json_codec`.
"""

from __future__ import annotations

from inferway.backends.binary_codec import decode_raw_tensor, encode_raw_tensor, split_binary_body
from inferway.backends.inference_request import DecodedRequest, RequestedOutput, select_outputs
from inferway.backends.input_validation import (
    DATATYPES,
    InferInputError,
    datatype_of,
    validate_input,
    validate_request_inputs,
)
from inferway.backends.json_codec import (
    decode_json_request,
    decode_json_tensor,
    encode_json_response,
    parse_json_header,
)

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
