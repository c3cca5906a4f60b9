"""The JSON + binary tensor codec: decoding, validation messages, encoding round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferway.backends.protocol import json_codec
from inferway.backends.protocol.binary_codec import (
    decode_raw_tensor,
    encode_raw_tensor,
    split_binary_body,
)
from inferway.backends.protocol.json_codec import (
    decode_json_request,
    encode_json_response,
    parse_json_header,
)
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import InferInputError, datatype_of
from inferway.backends.serving.request import RequestedOutput, select_outputs

SPECS = (
    TensorSpec("a", "FP32", (-1, 3)),
    TensorSpec("ids", "INT64", (-1, 2)),
)


def _req(**overrides: object) -> dict:
    doc = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
            {"name": "ids", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
        ]
    }
    doc.update(overrides)
    return doc


def _bad(doc: dict, binary: bytes = b"", specs=SPECS) -> str:
    with pytest.raises(InferInputError) as info:
        decode_json_request(doc, binary, specs)
    return str(info.value)


def test_flat_and_nested_data_decode_row_major() -> None:
    decoded = decode_json_request(
        _req(id="r7", parameters={"binary_data_output": True}), b"", SPECS
    )
    np.testing.assert_array_equal(
        decoded.inputs["a"], np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    )
    assert decoded.inputs["a"].dtype == np.float32
    np.testing.assert_array_equal(decoded.inputs["ids"], [[1, 2], [3, 4]])
    assert decoded.inputs["ids"].dtype == np.int64
    assert decoded.id == "r7"
    assert decoded.binary_output is True
    assert decoded.outputs is None


def test_binary_inputs_are_read_in_order_from_after_the_header() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ids = np.array([[7, 8], [9, 10]], dtype=np.int64)
    header = {
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [2, 3],
                "parameters": {"binary_data_size": a.nbytes},
            },
            {
                "name": "ids",
                "datatype": "INT64",
                "shape": [2, 2],
                "parameters": {"binary_data_size": ids.nbytes},
            },
        ]
    }
    head = json.dumps(header).encode()
    body = head + a.tobytes() + ids.tobytes()
    json_part, binary = split_binary_body(body, str(len(head)))
    decoded = decode_json_request(parse_json_header(json_part), binary, SPECS)
    np.testing.assert_array_equal(decoded.inputs["a"], a)
    np.testing.assert_array_equal(decoded.inputs["ids"], ids)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["inputs"].append(
                {"name": "zz", "datatype": "FP32", "shape": [1], "data": [1]}
            ),
            "unknown input 'zz'",
        ),
        (lambda d: d["inputs"].pop(1), "missing input(s): ids"),
        (
            lambda d: d["inputs"][0].update(datatype="INT32"),
            "datatype INT32 does not match the model's FP32",
        ),
        (lambda d: d["inputs"][0].update(shape=[6]), "has rank 1, the model expects rank 2"),
        (lambda d: d["inputs"][0].update(shape=[3, 2]), "dimension 1 is 2, the model expects 3"),
        (
            lambda d: d["inputs"][0].update(data=[1, 2, 3]),
            "data holds 3 values but shape [2, 3] needs 6",
        ),
        (lambda d: d["inputs"][1].update(data=[1.5, 2, 3, 4]), "INT64 data must be integers"),
        (lambda d: d["inputs"][0].update(data=["x"] * 6), "FP32 data must be numbers"),
        (lambda d: d["inputs"][0].update(data=[[1, 2], [3]]), "not a regular array"),
        (
            lambda d: d["inputs"][0].update(shape=[1, 3], data=[1, 2, 3]),
            "disagree on the batch size",
        ),
        (lambda d: d["inputs"][0].update(shape=[2, -3]), "negative size"),
        (lambda d: d["inputs"][0].pop("data"), "neither 'data' nor binary_data_size"),
        (lambda d: d.update(inputs=[]), "non-empty 'inputs'"),
        (lambda d: d["inputs"][0].update(datatype="FP99"), "unsupported datatype 'FP99'"),
    ],
)
def test_each_bad_request_is_refused_with_a_message_naming_it(mutate, expected: str) -> None:
    doc = _req()
    mutate(doc)
    assert expected in _bad(doc)


def test_int_values_out_of_range_are_refused() -> None:
    specs = (TensorSpec("x", "INT8", (-1,)),)
    doc = {"inputs": [{"name": "x", "datatype": "INT8", "shape": [2], "data": [1, 300]}]}
    assert "outside the INT8 range" in _bad(doc, specs=specs)


def test_binary_sizes_must_account_for_every_byte() -> None:
    specs = (TensorSpec("x", "FP32", (-1,)),)
    doc = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
        ]
    }
    assert "sum to 8 bytes but 12 bytes follow" in _bad(doc, b"\0" * 12, specs)
    assert "runs past the end of the body" in _bad(doc, b"\0" * 4, specs)
    doc["inputs"][0]["parameters"]["binary_data_size"] = 4
    assert "raw data is 4 bytes but shape [2] of FP32 needs 8" in _bad(doc, b"\0" * 4, specs)


def test_header_length_longer_than_body_is_refused() -> None:
    with pytest.raises(InferInputError, match="Inference-Header-Content-Length is 50"):
        split_binary_body(b"{}", "50")
    with pytest.raises(InferInputError, match="must be an integer"):
        split_binary_body(b"{}", "abc")


def test_malformed_json_is_refused() -> None:
    with pytest.raises(InferInputError, match="not valid JSON"):
        parse_json_header(b"{nope")
    with pytest.raises(InferInputError, match="must be a JSON object"):
        parse_json_header(b"[1, 2]")


def test_bytes_tensors_round_trip_through_raw_encoding() -> None:
    arr = np.array([b"hello", b"", "wörld".encode()], dtype=object)
    raw = encode_raw_tensor(arr)
    back = decode_raw_tensor("s", "BYTES", (3,), raw)
    assert list(back) == list(arr)
    with pytest.raises(InferInputError, match="2 BYTES elements"):
        decode_raw_tensor("s", "BYTES", (3,), encode_raw_tensor(arr[:2]))
    with pytest.raises(InferInputError, match="overruns"):
        decode_raw_tensor("s", "BYTES", (1,), (10).to_bytes(4, "little") + b"abc")


def test_response_json_and_binary_outputs_follow_the_request() -> None:
    y = np.arange(4, dtype=np.float32).reshape(2, 2)
    z = np.array([[1], [0]], dtype=np.bool_)
    chosen = select_outputs(
        {"y": y, "z": z}, [RequestedOutput("z"), RequestedOutput("y", True)], ["y", "z"]
    )
    body, head_len = encode_json_response(
        model_name="m", model_version="3", request_id="q", outputs=chosen
    )
    assert head_len is not None
    doc = json.loads(body[:head_len])
    assert doc["id"] == "q" and doc["model_version"] == "3"
    assert [o["name"] for o in doc["outputs"]] == ["z", "y"]
    assert doc["outputs"][0] == {
        "name": "z",
        "datatype": "BOOL",
        "shape": [2, 1],
        "data": [True, False],
    }
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(body[head_len:], np.float32).reshape(2, 2), y)
    plain, none = encode_json_response(
        model_name="m", model_version="1", request_id=None, outputs=[("y", y, None)]
    )
    assert none is None and json.loads(plain)["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0]


_F32 = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize(
    ("outputs", "binary_default", "head_built_once"),
    [
        ([("y", _F32, None)], True, True),
        (
            [("a", np.arange(3, dtype=np.int64), True), ("b", np.ones((1, 2), np.float16), None)],
            True,
            True,
        ),
        ([("z", np.array([[True], [False]]), True)], False, True),
        ([("s", np.float64(2.5).reshape(()), True)], False, True),
        ([("t", _F32.T, True)], False, True),  # not contiguous: sent in row-major order
        ([("e", _F32.astype(">f4"), True)], False, False),  # big-endian: swapped by the full path
        ([("y", _F32, None)], False, False),  # JSON data
        ([("y", _F32, True), ("j", _F32, False)], False, False),  # one of them JSON
        ([("w", np.array([b"ab", b"c"], dtype=object), True)], False, False),  # BYTES
    ],
)
def test_binary_answers_reuse_their_json_head_and_match_the_full_encoding(
    outputs: list, binary_default: bool, head_built_once: bool
) -> None:
    json_codec._binary_head.cache_clear()
    for _ in range(2):
        got = encode_json_response(
            model_name="m",
            model_version="2",
            request_id=None,
            outputs=outputs,
            binary_default=binary_default,
        )
        assert got == json_codec._encode_response(
            model_name="m",
            model_version="2",
            request_id=None,
            outputs=outputs,
            binary_default=binary_default,
            parameters=None,
        )
    info = json_codec._binary_head.cache_info()
    assert (info.misses, info.hits) == ((1, 1) if head_built_once else (0, 0))


def test_answers_with_an_id_or_parameters_build_their_own_head() -> None:
    json_codec._binary_head.cache_clear()
    body, size = encode_json_response(
        model_name="m", model_version="1", request_id="r-9", outputs=[("y", _F32, True)]
    )
    assert size is not None and json.loads(body[:size])["id"] == "r-9"
    body, size = encode_json_response(
        model_name="m",
        model_version="1",
        request_id=None,
        outputs=[("y", _F32, True)],
        parameters={"k": 1},
    )
    assert size is not None and json.loads(body[:size])["parameters"] == {"k": 1}
    assert json_codec._binary_head.cache_info().misses == 0


def test_unknown_requested_output_is_refused() -> None:
    with pytest.raises(InferInputError, match="unknown output 'nope'"):
        select_outputs({"y": np.zeros(1)}, [RequestedOutput("nope")], ["y"])


def test_datatype_names_match_numpy_dtypes() -> None:
    assert datatype_of(np.zeros(1, np.float16)) == "FP16"
    assert datatype_of(np.zeros(1, np.uint64)) == "UINT64"
    assert datatype_of(np.array([b"x"], dtype=object)) == "BYTES"
