"""Readiness tells the truth: ready only when every model in the repository serves a version.
A model whose only version was refused makes /v2/health/ready 503 and ServerReady false (its
requests would all be 404), while the other models keep answering. Real servers on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.backends.protocol import pb2
from inferway.devtools.demo_models import build_add
from tests.backend_helpers import grpc_stub, http_session, running_backend

pytestmark = pytest.mark.integration

_BODY = {
    "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1] * 4} for n in "ab"]
}


async def _ready(backend) -> tuple[int, bool, bool]:
    async with http_session(backend) as http, http.get("/v2/health/ready") as r:
        status, doc = r.status, await r.json()
    async with grpc_stub(backend) as stub:
        grpc_ready = (await stub.ServerReady(pb2.ServerReadyRequest())).ready
    return status, doc["ready"], grpc_ready


async def test_a_model_refused_at_load_makes_the_server_unready_until_it_loads(
    tmp_path: Path,
) -> None:
    build_add(tmp_path / "good" / "1" / "model.onnx")
    broken = tmp_path / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not an onnx model")
    async with running_backend(tmp_path) as backend:
        assert backend.repository.unserved() == ["broken"]
        assert await _ready(backend) == (503, False, False)
        async with http_session(backend) as http:
            async with http.post("/v2/models/good/infer", json=_BODY) as r:
                assert r.status == 200  # the other model still serves
            async with http.post("/v2/models/broken/infer", json=_BODY) as r:
                assert r.status == 404
            async with http.get("/metrics") as r:
                assert "\ninferway_backend_ready 0.0\n" in await r.text()
        build_add(broken)  # fixed
        await backend.repository.poll_once()
        assert await _ready(backend) == (200, True, True)


async def test_a_refused_new_version_beside_a_serving_one_keeps_the_server_ready(
    tmp_path: Path,
) -> None:
    build_add(tmp_path / "add" / "1" / "model.onnx")
    async with running_backend(tmp_path) as backend:
        bad = tmp_path / "add" / "2" / "model.onnx"
        bad.parent.mkdir()
        bad.write_bytes(b"truncated")
        events = await backend.repository.poll_once()
        assert [e.kind for e in events] == ["refused"]
        assert backend.repository.unserved() == []
        assert await _ready(backend) == (200, True, True)
