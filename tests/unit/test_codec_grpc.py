"""ModelInferRequest/Response conversion: typed contents, raw contents, same validation."""

from __future__ import annotations

import numpy as np
import pytest

from inferway.backends.protocol import pb2
from inferway.backends.protocol.grpc_codec import decode_grpc_request, encode_grpc_response
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import InferInputError
from inferway.backends.serving.request import RequestedOutput

SPECS = (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("k", "INT8", (-1,)))


def _request(raw: bool) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="m", id="abc")
    x = req.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    k = req.inputs.add(name="k", datatype="INT8", shape=[2])
    if raw:
        req.raw_input_contents.append(np.array([1, 2, 3, 4], np.float32).tobytes())
        req.raw_input_contents.append(np.array([-1, 5], np.int8).tobytes())
    else:
        x.contents.fp32_contents.extend([1, 2, 3, 4])
        k.contents.int_contents.extend([-1, 5])
    req.outputs.add(name="y").parameters["binary_data"].bool_param = True
    return req


@pytest.mark.parametrize("raw", [False, True])
def test_typed_and_raw_inputs_decode_to_the_same_arrays(raw: bool) -> None:
    decoded = decode_grpc_request(_request(raw), SPECS)
    np.testing.assert_array_equal(decoded.inputs["x"], [[1, 2], [3, 4]])
    assert decoded.inputs["x"].dtype == np.float32
    np.testing.assert_array_equal(decoded.inputs["k"], np.array([-1, 5], np.int8))
    assert decoded.inputs["k"].dtype == np.int8
    assert decoded.id == "abc"
    assert decoded.outputs == (RequestedOutput("y", True),)
    assert decoded.binary_output is raw  # answer in the form the client used


def test_raw_contents_count_must_match_inputs() -> None:
    req = _request(raw=True)
    del req.raw_input_contents[1]
    with pytest.raises(InferInputError, match="raw_input_contents has 1 entries"):
        decode_grpc_request(req, SPECS)


def test_typed_contents_length_and_range_are_checked() -> None:
    req = _request(raw=False)
    req.inputs[0].contents.fp32_contents.append(5)
    with pytest.raises(InferInputError, match="holds 5 values but shape"):
        decode_grpc_request(req, SPECS)
    req = _request(raw=False)
    req.inputs[1].contents.int_contents[0] = 1000
    with pytest.raises(InferInputError, match="outside the INT8 range"):
        decode_grpc_request(req, SPECS)


def test_fp16_without_raw_contents_is_refused() -> None:
    req = pb2.ModelInferRequest(model_name="m")
    req.inputs.add(name="h", datatype="FP16", shape=[1])
    with pytest.raises(InferInputError, match="send it in raw_input_contents"):
        decode_grpc_request(req, (TensorSpec("h", "FP16", (-1,)),))


def test_responses_are_typed_or_raw_and_fp16_forces_raw() -> None:
    y = np.array([[0.5, 1.5]], np.float32)
    typed = encode_grpc_response(
        model_name="m", model_version="1", request_id="i", outputs=[("y", y, None)], raw=False
    )
    assert list(typed.outputs[0].contents.fp32_contents) == [0.5, 1.5]
    assert list(typed.outputs[0].shape) == [1, 2] and typed.id == "i"
    raw = encode_grpc_response(
        model_name="m", model_version="1", request_id=None, outputs=[("y", y, None)], raw=True
    )
    np.testing.assert_array_equal(np.frombuffer(raw.raw_output_contents[0], np.float32), [0.5, 1.5])
    h = encode_grpc_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[("y", y, None), ("h", y.astype(np.float16), None)],
        raw=False,
    )
    assert len(h.raw_output_contents) == 2 and h.outputs[1].datatype == "FP16"
