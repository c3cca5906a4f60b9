"""Decoding plans (protocol/decode_plans.py): a binary-extension request whose JSON head was
seen before decodes to exactly what the full path gives, and nothing that could differ is
planned."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.backends.protocol.binary_codec import split_binary_body
from inferway.backends.protocol.decode_plans import DecodePlans
from inferway.backends.protocol.json_codec import decode_json_request, parse_json_header
from inferway.backends.runners.base import TensorSpec
from inferway.backends.serving.input_validation import InferInputError

SPECS = (TensorSpec("x", "FP32", (-1, 4)), TensorSpec("k", "INT64", (-1,)))


def request(
    rows: int = 2,
    *,
    extra: dict[str, Any] | None = None,
    x_size: int | None = None,
    seed: int = 0,
) -> tuple[bytes, str]:
    """(body, Inference-Header-Content-Length) of a request with both inputs binary."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, 4), dtype=np.float32).tobytes()
    k = rng.integers(0, 9, rows, dtype=np.int64).tobytes()
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [rows, 4],
                "parameters": {"binary_data_size": len(x) if x_size is None else x_size},
            },
            {
                "name": "k",
                "datatype": "INT64",
                "shape": [rows],
                "parameters": {"binary_data_size": len(k)},
            },
        ]
    }
    doc.update(extra or {})
    head = json.dumps(doc).encode()
    return head + x + k, str(len(head))


def full(body: bytes, length: str | None, specs=SPECS):
    head, binary = split_binary_body(body, length)
    return decode_json_request(parse_json_header(head), binary, specs)


def same(a, b) -> None:
    assert a.inputs.keys() == b.inputs.keys()
    for name in a.inputs:
        np.testing.assert_array_equal(a.inputs[name], b.inputs[name])
        assert a.inputs[name].dtype == b.inputs[name].dtype
        assert a.inputs[name].flags.writeable == b.inputs[name].flags.writeable
    assert (a.id, a.parameters, a.outputs, a.binary_output) == (
        b.id,
        b.parameters,
        b.outputs,
        b.binary_output,
    )


def test_a_head_seen_before_decodes_from_its_plan_to_what_the_full_path_gives():
    plans = DecodePlans()
    extra = {
        "id": "r1",
        "parameters": {"binary_data_output": True, "priority": 1},
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
    }
    first, length = request(extra=extra, seed=1)
    same(plans.decode("m", "1", first, length, SPECS), full(first, length))
    assert (plans.hits, plans.misses, len(plans)) == (0, 1, 1)
    second, _ = request(extra=extra, seed=2)  # same head, other tensors
    got = plans.decode("m", "1", second, length, SPECS)
    assert plans.hits == 1
    same(got, full(second, length))


def test_each_answer_gets_its_own_parameters():
    plans = DecodePlans()
    body, length = request(extra={"parameters": {"a": 1}})
    plans.decode("m", "1", body, length, SPECS)
    got = plans.decode("m", "1", body, length, SPECS)
    got.parameters["a"] = 2
    assert plans.decode("m", "1", body, length, SPECS).parameters == {"a": 1}


def test_a_body_of_another_size_takes_the_full_path_and_its_error():
    plans = DecodePlans()
    body, length = request()
    plans.decode("m", "1", body, length, SPECS)
    with pytest.raises(InferInputError) as planned:
        plans.decode("m", "1", body + b"\0" * 4, length, SPECS)
    with pytest.raises(InferInputError) as direct:
        full(body + b"\0" * 4, length)
    assert str(planned.value) == str(direct.value)
    assert plans.hits == 0


def test_plans_are_per_model_version_and_per_set_of_inputs():
    plans = DecodePlans()
    body, length = request()
    plans.decode("m", "1", body, length, SPECS)
    plans.decode("m", "2", body, length, SPECS)
    plans.decode("other", "1", body, length, SPECS)
    assert plans.hits == 0
    reloaded = tuple(list(SPECS))  # a reload's specs: equal, but another object
    plans.decode("m", "1", body, length, reloaded)
    assert plans.hits == 0
    narrower = (TensorSpec("x", "FP32", (-1, 4)),)
    with pytest.raises(InferInputError, match="unknown input 'k'"):
        plans.decode("m", "1", body, length, narrower)


def test_a_request_that_does_not_decode_is_never_planned():
    plans = DecodePlans()
    body, length = request(x_size=31)  # 31 of the 32 bytes
    for _ in range(2):
        with pytest.raises(InferInputError):
            plans.decode("m", "1", body, length, SPECS)
    assert len(plans) == 0


def test_json_data_bytes_and_nested_parameters_are_not_planned():
    plans = DecodePlans()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    head = json.dumps(doc).encode()
    plans.decode("m", "1", head, str(len(head)), (TensorSpec("x", "FP32", (-1, 4)),))
    text = b"\x02\0\0\0hi"
    doc = {
        "inputs": [
            {
                "name": "s",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"binary_data_size": len(text)},
            }
        ]
    }
    head = json.dumps(doc).encode()
    got = plans.decode("m", "1", head + text, str(len(head)), (TensorSpec("s", "BYTES", (-1,)),))
    assert got.inputs["s"].tolist() == [b"hi"]
    body, length = request(extra={"parameters": {"nested": {"a": 1}}})
    plans.decode("m", "1", body, length, SPECS)
    assert len(plans) == 0


def test_without_the_binary_header_or_with_a_bad_one_it_is_the_full_path():
    plans = DecodePlans()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    body = json.dumps(doc).encode()
    specs = (TensorSpec("x", "FP32", (-1, 4)),)
    same(plans.decode("m", "1", body, None, specs), full(body, None, specs))
    for bad in ("3x", "\u00b2"):  # "²" is a digit to str.isdigit, not to int()
        with pytest.raises(InferInputError, match="must be an integer"):
            plans.decode("m", "1", body, bad, specs)
    assert len(plans) == 0


def test_the_oldest_plan_is_dropped_at_capacity():
    plans = DecodePlans(capacity=2)
    bodies = [request(rows=r) for r in (1, 2, 3)]
    for body, length in bodies:
        plans.decode("m", "1", body, length, SPECS)
    assert len(plans) == 2
    plans.decode("m", "1", *bodies[0], SPECS)  # dropped: a miss
    plans.decode("m", "1", *bodies[2], SPECS)  # kept: a hit
    assert plans.hits == 1


def test_capacity_zero_plans_nothing():
    plans = DecodePlans(capacity=0)
    body, length = request()
    for _ in range(3):
        same(plans.decode("m", "1", body, length, SPECS), full(body, length))
    assert (plans.hits, len(plans)) == (0, 0)
    with pytest.raises(ValueError, match="capacity"):
        DecodePlans(capacity=-1)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 3),
    shape_rows=st.integers(0, 3),
    x_size=st.integers(0, 100),
    tail=st.binary(max_size=8),
    request_id=st.one_of(st.none(), st.text(max_size=3), st.integers(0, 3)),
)
def test_planned_or_not_the_outcome_is_the_full_paths(rows, shape_rows, x_size, tail, request_id):
    rng = np.random.default_rng(rows)
    x = rng.random((rows, 4), dtype=np.float32).tobytes()
    k = np.arange(rows, dtype=np.int64).tobytes()
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [shape_rows, 4],
                "parameters": {"binary_data_size": x_size},
            },
            {
                "name": "k",
                "datatype": "INT64",
                "shape": [rows],
                "parameters": {"binary_data_size": len(k)},
            },
        ]
    }
    if request_id is not None:
        doc["id"] = request_id
    head = json.dumps(doc).encode()
    body, length = head + x + k + tail, str(len(head))
    plans = DecodePlans()
    outcomes = []
    for _ in range(3):  # the first decodes the full way; the others may use its plan
        try:
            outcomes.append(plans.decode("m", "1", body, length, SPECS))
        except InferInputError as exc:
            outcomes.append(str(exc))
    try:
        expected: Any = full(body, length)
    except InferInputError as exc:
        expected = str(exc)
    for got in outcomes:
        if isinstance(expected, str):
            assert got == expected
        else:
            same(got, expected)
