"""One serving core behind both wires: the same limits and deadlines refuse the same requests on
HTTP and on gRPC, with the same message, and are counted alike. Real servers on loopback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from inferway.backends.protocol import pb2
from inferway.backends.serving.settings import ServingSettings
from inferway.devtools.demo_models import build_add
from tests.backend_helpers import grpc_stub, http_session, running_backend
from tests.prometheus_text import parse_exposition, sample_value

pytestmark = pytest.mark.integration

LIMIT = 4096
DEFAULT_TIMEOUT_S = 1.0
SLOW_WINDOW_S = 8.0
SLOW = {"batching": {"mode": "fixed", "max_batch_size": 64, "max_queue_delay_s": SLOW_WINDOW_S}}


@pytest.fixture
async def backend(tmp_path: Path):
    build_add(tmp_path / "add" / "1" / "model.onnx")
    build_add(tmp_path / "small" / "1" / "model.onnx")
    (tmp_path / "small" / "config.yaml").write_text("max_input_bytes: 512\n")
    build_add(tmp_path / "roomy" / "1" / "model.onnx")
    (tmp_path / "roomy" / "config.yaml").write_text("max_input_bytes: 1048576\n")
    build_add(tmp_path / "slow" / "1" / "model.onnx")
    (tmp_path / "slow" / "config.yaml").write_text(json.dumps(SLOW))
    settings = ServingSettings(max_body_bytes=LIMIT, default_timeout_s=DEFAULT_TIMEOUT_S)
    async with running_backend(tmp_path, settings) as handle:
        yield handle


@pytest.fixture
async def http(backend):
    async with http_session(backend) as session:
        yield session


@pytest.fixture
async def stub(backend):
    async with grpc_stub(backend) as stub:
        yield stub


def _tensors(rows: int) -> dict[str, np.ndarray]:
    return {n: np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) for n in ("a", "b")}


def _binary_body(rows: int, **parameters: object) -> tuple[bytes, dict[str, str]]:
    """The OIP binary extension: the same raw bytes the gRPC request carries."""
    tensors = _tensors(rows)
    head = {
        "inputs": [
            {
                "name": n,
                "datatype": "FP32",
                "shape": list(a.shape),
                "parameters": {"binary_data_size": a.nbytes},
            }
            for n, a in tensors.items()
        ],
        "parameters": parameters,
    }
    header = json.dumps(head).encode()
    body = header + b"".join(a.tobytes() for a in tensors.values())
    return body, {"Inference-Header-Content-Length": str(len(header))}


def _grpc_request(model: str, rows: int, **parameters: int) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model)
    for n, a in _tensors(rows).items():
        req.inputs.add(name=n, datatype="FP32", shape=list(a.shape))
        req.raw_input_contents.append(a.tobytes())
    for key, value in parameters.items():
        req.parameters[key].int64_param = value
    return req


async def _http_infer(http, model: str, rows: int, **parameters: object) -> tuple[int, str]:
    body, headers = _binary_body(rows, **parameters)
    async with http.post(f"/v2/models/{model}/infer", data=body, headers=headers) as r:
        text = await r.text()
        return r.status, (json.loads(text).get("error", "") if r.status != 200 else "")


async def _grpc_infer(stub, model: str, rows: int, **parameters: int) -> tuple[str, str]:
    try:
        await stub.ModelInfer(_grpc_request(model, rows, **parameters))
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


async def _requests_counted(http, **labels: str) -> float:
    async with http.get("/metrics") as r:
        samples = parse_exposition(await r.text())
    return sample_value(samples, "inferway_backend_requests_total", **labels)


@pytest.mark.parametrize(
    ("model", "limit"),
    [("add", LIMIT), ("small", 512), ("roomy", LIMIT)],
    ids=["server-limit", "model-limit-below-it", "model-limit-capped-by-it"],
)
async def test_one_limit_refuses_the_same_oversized_request_on_http_and_grpc(
    http, stub, model: str, limit: int
) -> None:
    rows = limit // 32 + 1  # two FP32 inputs of 4 columns: 32 bytes a row, just over the limit
    assert len(_binary_body(rows)[0]) > limit and _grpc_request(model, rows).ByteSize() > limit
    expected = f"exceeds the limit of {limit} bytes for model '{model}'"
    status, error = await _http_infer(http, model, rows)
    assert status == 413 and expected in error
    code, details = await _grpc_infer(stub, model, rows)
    assert code == "RESOURCE_EXHAUSTED" and expected in details
    assert await _requests_counted(http, model=model, protocol="http", code="413") == 1
    assert (
        await _requests_counted(http, model=model, protocol="grpc", code="RESOURCE_EXHAUSTED") == 1
    )
    # A request under the limit goes through on both.
    small_rows = min(8, (limit - 400) // 32)  # under the limit, within one batch
    assert (await _http_infer(http, model, small_rows))[0] == 200
    assert (await _grpc_infer(stub, model, small_rows))[0] == "OK"


async def test_a_body_of_unknown_length_is_held_to_the_same_limit(http) -> None:
    body, headers = _binary_body(LIMIT // 32 + 1)

    async def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    async with http.post("/v2/models/add/infer", data=chunks(), headers=headers) as r:
        assert r.status == 413
        assert f"exceeds the limit of {LIMIT} bytes for model 'add'" in (await r.json())["error"]


@pytest.mark.parametrize(
    ("parameters", "bound_s"),
    [({"timeout": 100_000}, 0.1), ({}, DEFAULT_TIMEOUT_S)],
    ids=["request-timeout-parameter", "configured-default-timeout"],
)
async def test_the_same_deadline_ends_the_request_on_http_and_grpc(
    backend, http, stub, parameters: dict[str, int], bound_s: float
) -> None:
    started = time.monotonic()
    status, error = await _http_infer(http, "slow", 1, **parameters)
    http_s = time.monotonic() - started
    assert status == 504 and error.startswith("deadline exceeded: ")
    started = time.monotonic()
    code, details = await _grpc_infer(stub, "slow", 1, **parameters)
    grpc_s = time.monotonic() - started
    assert code == "DEADLINE_EXCEEDED" and details.startswith("deadline exceeded: ")
    for took in (http_s, grpc_s):  # answered at the deadline, not at the end of the 8 s window
        assert bound_s <= took + 0.02 and took < SLOW_WINDOW_S / 2
    assert await _requests_counted(http, model="slow", protocol="http", code="504") == 1
    assert (
        await _requests_counted(http, model="slow", protocol="grpc", code="DEADLINE_EXCEEDED") == 1
    )
    assert backend.repository.get("slow").executor.queue_depth == 0  # neither was left queued


def test_serving_settings_refuse_nonsense_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1"):
        ServingSettings(max_body_bytes=0)
    with pytest.raises(ValueError, match="default_timeout_s must be > 0"):
        ServingSettings(default_timeout_s=0)


def test_a_client_deadline_tighter_than_the_default_wins() -> None:
    settings = ServingSettings(default_timeout_s=5.0)
    assert settings.timeout_s(None, None) == 5.0
    assert settings.timeout_s(0.2, None) == 0.2
    assert settings.timeout_s(None, 0.3) == 0.3
    assert settings.timeout_s(0.2, 0.3) == 0.2
    assert ServingSettings().timeout_s(None, None) is None
