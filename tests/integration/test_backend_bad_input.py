"""Every bad HTTP request gets a 4xx/5xx JSON answer naming what was wrong, the server keeps
serving, and under concurrency every request gets exactly one answer (its own)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from inferway.devtools.demo_models import build_add
from tests.backend_helpers import http_session, running_backend

pytestmark = pytest.mark.integration

SLOW = {
    "batching": {
        "mode": "fixed",
        "max_batch_size": 64,
        "max_queue_delay_s": 1.0,
        "max_queue_size": 1,
    }
}


@pytest.fixture
async def backend(tmp_path: Path):
    build_add(tmp_path / "add" / "1" / "model.onnx")
    build_add(tmp_path / "small" / "1" / "model.onnx")
    (tmp_path / "small" / "config.yaml").write_text("max_input_bytes: 512\n")
    build_add(tmp_path / "slow" / "1" / "model.onnx")
    (tmp_path / "slow" / "config.yaml").write_text(json.dumps(SLOW))
    async with running_backend(tmp_path) as handle:
        yield handle


@pytest.fixture
async def http(backend):
    async with http_session(backend) as session:
        yield session


def _good(rows: int = 1, **extra: object) -> dict:
    data = list(range(rows * 4))
    doc = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [rows, 4], "data": data} for n in ("a", "b")
        ]
    }
    doc.update(extra)
    return doc


async def _post(http, path: str, **kwargs) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    async with http.post(path, **kwargs) as r:
        return r.status, await r.json(), r.headers


async def _assert_still_serving(http) -> None:
    status, doc, _ = await _post(http, "/v2/models/add/infer", json=_good())
    assert status == 200, doc


def _mutated(fn) -> dict:
    doc = _good()
    fn(doc)
    return doc


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            _mutated(lambda d: d["inputs"].append(dict(d["inputs"][0], name="c"))),
            "unknown input 'c'",
        ),
        (_mutated(lambda d: d["inputs"].pop()), "missing input(s): b"),
        (
            _mutated(lambda d: d["inputs"][0].update(datatype="INT64")),
            "datatype INT64 does not match the model's FP32",
        ),
        (_mutated(lambda d: d["inputs"][0].update(shape=[4])), "rank 1, the model expects rank 2"),
        (
            _mutated(lambda d: d["inputs"][0].update(shape=[2, 2])),
            "dimension 1 is 2, the model expects 4",
        ),
        (
            _mutated(lambda d: d["inputs"][0].update(shape=[2, 4])),
            "data holds 4 values but shape [2, 4] needs 8",
        ),
    ],
)
async def test_invalid_tensors_are_400_with_the_reason(http, body: dict, expected: str) -> None:
    status, doc, headers = await _post(http, "/v2/models/add/infer", json=body)
    assert status == 400
    assert expected in doc["error"]
    assert "endpoint-load-metrics" in headers
    await _assert_still_serving(http)


async def test_malformed_json_is_400(http) -> None:
    status, doc, _ = await _post(http, "/v2/models/add/infer", data=b'{"inputs": [')
    assert status == 400 and "not valid JSON" in doc["error"]


async def test_binary_header_longer_than_body_is_400(http) -> None:
    body = json.dumps(_good()).encode()
    status, doc, _ = await _post(
        http,
        "/v2/models/add/infer",
        data=body,
        headers={"Inference-Header-Content-Length": str(len(body) + 10)},
    )
    assert status == 400
    assert f"Inference-Header-Content-Length is {len(body) + 10}" in doc["error"]


async def test_binary_sizes_not_summing_to_the_rest_is_400(http) -> None:
    a = np.ones((1, 4), np.float32).tobytes()
    header = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
            for n in ("a", "b")
        ]
    }
    head = json.dumps(header).encode()
    status, doc, _ = await _post(
        http,
        "/v2/models/add/infer",
        data=head + a + a + b"extra",
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert status == 400 and "sum to 32 bytes but 37 bytes follow" in doc["error"]


async def test_body_over_the_models_limit_is_413(http) -> None:
    big = _good(rows=40)  # well over the 512 bytes allowed by small/config.yaml
    status, doc, _ = await _post(http, "/v2/models/small/infer", json=big)
    assert status == 413
    assert "exceeds the limit of 512 bytes for model 'small'" in doc["error"]
    status, _, _ = await _post(http, "/v2/models/small/infer", json=_good())
    assert status == 200


async def test_unknown_model_version_and_route_are_404(http) -> None:
    status, doc, _ = await _post(http, "/v2/models/ghost/infer", json=_good())
    assert status == 404 and "model 'ghost' not found; available: add, slow, small" in doc["error"]
    status, doc, _ = await _post(http, "/v2/models/add/versions/3/infer", json=_good())
    assert status == 404 and "has no version 3" in doc["error"]
    async with http.get("/v3/whatever") as r:
        assert r.status == 404 and "error" in await r.json()


async def _wait_queued(backend, depth: int) -> None:
    executor = backend.repository.get("slow").executor
    deadline = time.monotonic() + 5
    while executor.queue_depth < depth:
        assert time.monotonic() < deadline, "request never queued"
        await asyncio.sleep(0.01)


async def test_queue_full_is_429_with_retry_after(backend, http) -> None:
    first = asyncio.ensure_future(_post(http, "/v2/models/slow/infer", json=_good()))
    await _wait_queued(backend, 1)
    status, doc, headers = await _post(http, "/v2/models/slow/infer", json=_good())
    assert status == 429 and "queue full" in doc["error"]
    assert int(headers["Retry-After"]) >= 1
    assert (await first)[0] == 200


async def test_deadline_from_parameter_or_envoy_header_is_504(http) -> None:
    started = time.monotonic()
    status, doc, _ = await _post(
        http,
        "/v2/models/slow/infer",
        json=_good(parameters={"timeout": 100_000}),  # 100 ms
    )
    assert status == 504 and "deadline" in doc["error"]
    assert time.monotonic() - started < 0.9  # not held for the 1 s batch window
    status, doc, _ = await _post(
        http,
        "/v2/models/slow/infer",
        json=_good(),
        headers={"x-envoy-expected-rq-timeout-ms": "100"},
    )
    assert status == 504 and "deadline" in doc["error"]
    status, doc, _ = await _post(
        http, "/v2/models/add/infer", json=_good(parameters={"timeout": -1})
    )
    assert status == 400 and "'timeout'" in doc["error"]


async def test_every_concurrent_request_gets_exactly_its_own_answer(http) -> None:
    async def one(i: int) -> tuple[int, int, dict]:
        kind = i % 3
        if kind == 0:  # valid, distinct data per request
            body = {
                "id": f"req-{i}",
                "inputs": [
                    {"name": "a", "datatype": "FP32", "shape": [1, 4], "data": [i] * 4},
                    {"name": "b", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4},
                ],
            }
            status, doc, _ = await _post(http, "/v2/models/add/infer", json=body)
        elif kind == 1:
            status, doc, _ = await _post(http, "/v2/models/add/infer", data=b"not json")
        else:
            status, doc, _ = await _post(http, "/v2/models/nope/infer", json=_good())
        return i, status, doc

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(90))), timeout=30)
    assert len(results) == 90
    for i, status, doc in results:
        if i % 3 == 0:
            assert status == 200, doc
            assert doc["id"] == f"req-{i}"
            assert doc["outputs"][0]["data"] == [i + 1] * 4  # its own rows, not a neighbour's
        else:
            assert status == (400 if i % 3 == 1 else 404), doc
            assert doc["error"]
