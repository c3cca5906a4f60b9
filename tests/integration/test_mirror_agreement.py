"""Output agreement end to end: a real Envoy mirrors every request from the stable backend
to a canary; both real inference backends record digests of their answers by x-request-id;
the rollout's comparator pairs them. An identical canary agrees on every mirrored request,
a canary with other weights disagrees on every one, and clients only see stable's answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from inferway.backends.app import BackendHandle, start_backend
from inferway.backends.protocol import pb2
from inferway.backends.serving.settings import ServingSettings
from inferway.backends.telemetry.output_digest import OutputDigest
from inferway.controllers.rollout.evidence import MirrorCounts
from inferway.devtools.demo_models import build_mlp, mlp_reference
from inferway.gateway.agreement_source import AgreementSource
from tests.backend_helpers import grpc_stub, running_backend
from tests.envoy_process import free_port
from tests.traffic_harness import TrafficGateway, poll_until

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
RECORDING = ServingSettings(record_outputs=1000)

POLICY = """
listeners: [{{name: edge, port: {listener_port}}}]
services:
  - name: stable
    endpoints: ["127.0.0.1:STABLE"]
  - name: canary
    endpoints: ["127.0.0.1:CANARY"]
routes:
  - name: infer
    backends: [{{service: stable}}]
    mirror: {{service: canary, percent: 100}}
"""


def _repo(root: Path, seed: int) -> Path:
    build_mlp(root / "mlp" / "1" / "model.onnx", SIZES, seed=seed)
    return root


@asynccontextmanager
async def _backends(tmp: Path, canary_seed: int) -> AsyncIterator[list[BackendHandle]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                running_backend(_repo(tmp / name, seed), settings=RECORDING)
            )
            for name, seed in (("stable", 0), ("canary", canary_seed))
        ]


def _url(backend: BackendHandle) -> str:
    return f"http://127.0.0.1:{backend.http_port}"


async def _digests(session: aiohttp.ClientSession, backend: BackendHandle) -> list[OutputDigest]:
    url = f"{_url(backend)}/v2/debug/outputs"
    async with session.get(url, params={"since": "0"}) as response:
        assert response.status == 200, await response.text()
        body = await response.json()
    return [OutputDigest.from_json(r) for r in body["records"]]


async def _mirror_and_compare(tmp: Path, canary_seed: int, n: int) -> MirrorCounts:
    async with _backends(tmp, canary_seed) as (stable, canary):
        policy = POLICY.replace("STABLE", str(stable.http_port)).replace(
            "CANARY", str(canary.http_port)
        )
        async with TrafficGateway(policy, []) as gw:
            assert gw.session is not None
            rng = np.random.default_rng(7)
            for _ in range(n):
                x = rng.standard_normal((2, SIZES[0])).astype(np.float32)
                body = {
                    "inputs": [
                        {
                            "name": "x",
                            "datatype": "FP32",
                            "shape": [2, 8],
                            "data": x.ravel().tolist(),
                        }
                    ]
                }
                async with gw.session.post(gw.url + "/v2/models/mlp/infer", json=body) as r:
                    assert r.status == 200, await r.text()
                    answer = np.array((await r.json())["outputs"][0]["data"]).reshape(2, -1)
                # clients get stable's answer (seed 0), whatever the canary computes
                np.testing.assert_allclose(answer, mlp_reference(x, SIZES, 0), rtol=1e-4)

            async def mirrored() -> bool:
                return len(await _digests(gw.session, canary)) >= n  # type: ignore[arg-type]

            await poll_until(mirrored, timeout=15, what="the canary to record every mirror")
            source = AgreementSource(stable=[_url(stable)], canary=[_url(canary)])
            window = await source.poll()
            assert window.unreachable == ()
            assert len(window.examples) == min(window.mirror.disagreed, 5)
            counts = window.mirror
            return counts


async def test_an_identical_canary_agrees_on_every_mirrored_request(tmp_path: Path) -> None:
    assert await _mirror_and_compare(tmp_path, 0, 40) == MirrorCounts(compared=40, disagreed=0)


async def test_a_different_canary_disagrees_on_every_mirrored_request(tmp_path: Path) -> None:
    assert await _mirror_and_compare(tmp_path, 1, 40) == MirrorCounts(compared=40, disagreed=40)


async def test_the_digest_endpoint_is_off_unless_asked_for_and_checks_its_query(
    tmp_path: Path,
) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}]}
    async with (
        running_backend(_repo(tmp_path / "off", 0)) as off,
        running_backend(_repo(tmp_path / "on", 0), settings=RECORDING) as on,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(f"http://127.0.0.1:{off.http_port}/v2/debug/outputs") as r:
            assert r.status == 404 and "--record-outputs" in (await r.json())["error"]
        base = f"http://127.0.0.1:{on.http_port}"
        for headers in ({"x-request-id": "abc"}, {}):  # no id: nothing to pair, not kept
            async with s.post(base + "/v2/models/mlp/infer", json=body, headers=headers) as r:
                assert r.status == 200
        async with s.get(base + "/v2/debug/outputs") as r:
            page = await r.json()
        assert [d["request_id"] for d in page["records"]] == ["abc"]
        assert page["next"] == page["records"][0]["seq"] and page["evicted"] == 0
        async with s.get(base + "/v2/debug/outputs", params={"since": "x"}) as r:
            assert r.status == 400 and "whole numbers" in (await r.json())["error"]


async def test_unary_grpc_answers_are_recorded_under_the_metadata_request_id(
    tmp_path: Path,
) -> None:
    x = np.ones((1, SIZES[0]), np.float32)
    request = pb2.ModelInferRequest(model_name="mlp", id="body-id")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(x.tobytes())
    async with (
        running_backend(_repo(tmp_path, 0), settings=RECORDING) as backend,
        grpc_stub(backend) as stub,
        aiohttp.ClientSession() as session,
    ):
        await stub.ModelInfer(request, metadata=(("x-request-id", "grpc-1"),))
        (digest,) = await _digests(session, backend)
    assert digest.request_id == "grpc-1"
    (y,) = digest.outputs
    assert y.shape == (1, SIZES[-1])
    assert y.head == pytest.approx(mlp_reference(x, SIZES, 0).ravel().tolist(), rel=1e-4)


async def _infer(session: aiohttp.ClientSession, backend: BackendHandle, request_id: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]}
    headers = {"x-request-id": request_id}
    async with session.post(
        _url(backend) + "/v2/models/mlp/infer", json=body, headers=headers
    ) as r:
        assert r.status == 200, await r.text()


async def test_the_source_reads_each_replica_once_and_starts_over_after_a_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    stable_repo, canary_repo = _repo(tmp_path / "s", 0), _repo(tmp_path / "c", 0)
    async with (
        running_backend(canary_repo, settings=RECORDING) as canary,
        aiohttp.ClientSession() as session,
    ):
        source = AgreementSource(stable=[f"http://127.0.0.1:{port}"], canary=[_url(canary)])
        first = await start_backend(stable_repo, http_port=port, watch=False, settings=RECORDING)
        try:
            for rid in ("a", "b"):
                await _infer(session, first, rid)
                await _infer(session, canary, rid)
            assert (await source.poll()).mirror == MirrorCounts(compared=2, disagreed=0)
            assert (await source.poll()).mirror == MirrorCounts()  # nothing read twice
        finally:
            await first.stop()
        down = await source.poll()
        assert down.mirror == MirrorCounts() and str(port) in down.unreachable[0]
        again = await start_backend(stable_repo, http_port=port, watch=False, settings=RECORDING)
        try:
            await _infer(session, again, "c")  # seq 1 again, under a new epoch
            await _infer(session, canary, "c")
            assert (await source.poll()).mirror == MirrorCounts(compared=1, disagreed=0)
        finally:
            await again.stop()
