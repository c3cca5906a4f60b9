"""Inference bodies a client should never send get a 400 with the reason, and every answer is
JSON a strict parser reads (issue 33, items 7 and 9): a body nested thousands of levels deep
(it was a 500 RecursionError), NaN / Infinity / 1e400 inputs (they came back as a bare
``NaN``, which is not JSON), and non-finite outputs. Both HTTP front ends and gRPC, on
loopback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferway.backends.protocol import pb2
from inferway.backends.serving.settings import ServingSettings
from inferway.devtools.demo_models import build_add
from tests.backend_helpers import grpc_stub, http_session, running_backend

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fast", "aiohttp"])
async def backend(tmp_path: Path, request: pytest.FixtureRequest):
    build_add(tmp_path / "add" / "1" / "model.onnx")
    settings = ServingSettings(http_frontend=request.param)
    async with running_backend(tmp_path, settings=settings) as handle:
        yield handle


def _strict(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} is not JSON: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def _body(a: str, b: str = "[1, 1, 1, 1]") -> str:
    return (
        '{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 4], "data": '
        + a
        + '}, {"name": "b", "datatype": "FP32", "shape": [1, 4], "data": '
        + b
        + "}]}"
    )


async def _post(backend, body: str | bytes, **headers: str) -> tuple[int, str]:
    async with (
        http_session(backend) as http,
        http.post("/v2/models/add/infer", data=body, headers=headers) as resp,
    ):
        return resp.status, await resp.text()


@pytest.mark.parametrize("depth", [5_000, 200_000])
async def test_a_deeply_nested_body_is_a_400_with_the_reason(backend, depth: int) -> None:
    status, text = await _post(backend, '{"inputs": ' + "[" * depth + "]" * depth + "}")
    assert status == 400, text
    assert "nested too deeply" in text or "inputs" in text
    status, text = await _post(backend, _body("[1, 2, 3, 4]"))
    assert status == 200, "the server stopped answering"


@pytest.mark.parametrize(
    "data", ["[NaN, 1, 2, 3]", "[Infinity, 1, 2, 3]", "[-Infinity, 1, 2, 3]", "[1e400, 1, 2, 3]"]
)
async def test_non_finite_json_inputs_are_refused_with_the_reason(backend, data: str) -> None:
    status, text = await _post(backend, _body(data))
    assert status == 400, text
    assert "input 'a': JSON data must be finite FP32 numbers" in _strict(text)["error"]


async def test_a_number_beyond_fp32_is_refused_not_made_infinite(backend) -> None:
    status, text = await _post(backend, _body("[1e39, 1, 2, 3]"))
    assert status == 400, text
    assert "finite FP32" in text


async def test_non_finite_outputs_are_written_as_json_strings(backend) -> None:
    """Inputs sent as raw bytes may hold infinities; their sum and difference are NaN and
    +-Infinity, which the JSON answer spells as strings."""
    a = np.array([[np.inf, 1.0, -np.inf, 2.0]], np.float32)
    b = np.array([[-np.inf, 1.0, np.inf, 1.0]], np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                }
                for n in "ab"
            ],
            "outputs": [{"name": "sum"}, {"name": "diff"}],
        }
    ).encode()
    status, text = await _post(
        backend,
        head + a.tobytes() + b.tobytes(),
        **{"Inference-Header-Content-Length": str(len(head))},
    )
    assert status == 200, text
    outputs = {o["name"]: o["data"] for o in _strict(text)["outputs"]}
    assert outputs["sum"] == ["NaN", 2.0, "NaN", 3.0]
    assert outputs["diff"] == ["Infinity", 0.0, "-Infinity", 1.0]


async def test_grpc_answers_non_finite_outputs_as_raw_floats(backend) -> None:
    """gRPC carries IEEE floats as they are: nothing to spell."""
    req = pb2.ModelInferRequest(model_name="add")
    for n, values in (("a", [np.inf, 1, 2, 3]), ("b", [-np.inf, 1, 2, 3])):
        req.inputs.add(name=n, datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.array([values], np.float32).tobytes())
    async with grpc_stub(backend) as stub:
        answer = await stub.ModelInfer(req)
    names = [o.name for o in answer.outputs]
    total = np.frombuffer(answer.raw_output_contents[names.index("sum")], np.float32)
    assert np.isnan(total[0]) and total[1] == 2.0
