"""A rollout judged on the backends' own metrics, end to end: the gateway's composition root
with a real Envoy, two real inference backends (the serving core ``inferway serve`` runs),
the canary slower inside the server (its batcher waits 40 ms for company). With only
``backend-latency-p99`` in the analysis, the rollout reads both backends' /metrics and rolls
the canary back on that check; a canary whose /metrics cannot be read pauses the rollout with
that reason instead of promoting blind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inferway.devtools.demo_models import build_mlp
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.backend_helpers import running_backend
from tests.envoy_process import free_port
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)
POLICY = """version: 1
listeners: [{{name: edge, port: {listener}}}]
services:
  - {{name: v1, endpoints: ["127.0.0.1:{stable}"]}}
  - {{name: v2, endpoints: ["127.0.0.1:{canary}"]}}
routes:
  - name: inference
    backends: [{{service: v1, weight: 100}}, {{service: v2, weight: 0}}]
rollouts:
  - name: slow-v2
    route: inference
    stable: v1
    canary: v2
    steps: [50, 100]
    analysis:
      interval: 1s
      metrics: [{{name: backend-latency-p99, max_increase: 20%}}]
"""
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _repo(root: Path, batching: str) -> Path:
    build_mlp(root / "mlp" / "1" / "model.onnx", SIZES, seed=0)
    (root / "mlp" / "config.yaml").write_text(f"batching: {batching}\n")
    return root


@asynccontextmanager
async def _gateway(tmp: Path, stable: int, canary: int) -> AsyncIterator[tuple[Gateway, int]]:
    listener = free_port()
    path = tmp / "policy.yaml"
    path.write_text(POLICY.format(listener=listener, stable=stable, canary=canary))
    options = GatewayOptions(
        policy_path=path, xds_port=0, admin_port=0, envoy_admin_port=free_port(), workdir=tmp
    )
    gateway = await start_gateway(options)
    try:
        assert gateway.supervisor is not None and await gateway.supervisor.wait_ready(20)
        version = gateway.control_plane.version
        assert version and await gateway.cache.wait_for_acks(version, timeout=15)
        yield gateway, listener
    finally:
        await gateway.stop()


def _status(gateway: Gateway) -> dict[str, Any]:
    assert gateway.rollouts is not None
    return gateway.rollouts.status("slow-v2", history=100)


async def test_a_canary_slower_inside_the_server_is_rolled_back_on_backend_latency(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        stable = await stack.enter_async_context(
            running_backend(_repo(tmp_path / "v1", "{mode: 'off'}"))
        )
        canary = await stack.enter_async_context(
            running_backend(
                _repo(tmp_path / "v2", "{mode: fixed, max_batch_size: 64, max_queue_delay_s: 0.04}")
            )
        )
        gateway, listener = await stack.enter_async_context(
            _gateway(tmp_path, stable.http_port, canary.http_port)
        )
        failures: list[str] = []
        loading = True

        async def client(session: aiohttp.ClientSession) -> None:
            url = f"http://127.0.0.1:{listener}/v2/models/mlp/infer"
            while loading:
                async with session.post(url, json=BODY) as response:
                    if response.status != 200:
                        failures.append(f"{response.status} {await response.text()}")

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            clients = [asyncio.create_task(client(session)) for _ in range(2)]
            try:
                await poll_until(
                    lambda: _status(gateway)["phase"] in ("rolled_back", "promoted"),
                    timeout=60,
                    what="the rollout to decide",
                )
            finally:
                loading = False
                await asyncio.gather(*clients)

    status = _status(gateway)
    assert status["phase"] == "rolled_back", status["reason"]
    assert failures == []
    rollback = next(d for d in status["history"] if d["action"] == "rollback")
    (verdict,) = rollback["verdicts"]
    assert verdict["check"] == "backend-latency-p99" and verdict["result"] == "fail"
    inputs = verdict["inputs"]
    assert inputs["canary_p50_ms"] >= 25 > inputs["stable_p50_ms"], inputs  # buckets: ms
    assert inputs["canary_samples"] >= 20 and inputs["stable_samples"] >= 20
    backend = status["evidence"]["backend"]
    assert backend["canary"]["requests"] >= 20 and backend["stable"]["requests"] >= 20
    assert dict(gateway.control_plane.state.weights["inference"]) == {"v1": 100.0, "v2": 0.0}


async def test_a_canary_whose_metrics_cannot_be_read_pauses_the_rollout(tmp_path: Path) -> None:
    closed = free_port()
    async with (
        running_backend(_repo(tmp_path / "v1", "{mode: 'off'}")) as stable,
        _gateway(tmp_path, stable.http_port, closed) as (gateway, _listener),
    ):
        await poll_until(
            lambda: _status(gateway)["phase"] == "paused", timeout=30, what="a paused rollout"
        )
        status = _status(gateway)
    assert status["paused_by"] == "source"
    assert f"backend /metrics unreachable: http://127.0.0.1:{closed}:" in status["reason"]
    assert all(d["action"] not in ("advance", "promote") for d in status["history"])
