"""A rollout judged on its canary's answers: Envoy mirrors the route's requests to the
canary, both real inference backends record digests of their answers, and the rollout's
output-agreement check rolls back a canary that computes something else (other weights),
though it never fails a request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from inferway.backends.app import BackendHandle
from inferway.backends.serving.settings import ServingSettings
from inferway.devtools.demo_models import build_mlp
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from tests.backend_helpers import running_backend
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

SIZES = (8, 16, 4)

POLICY = """version: 1
listeners: [{{name: edge, port: {listener}}}]
services:
  - {{name: stable, endpoints: ["127.0.0.1:{stable}"]}}
  - {{name: canary, endpoints: ["127.0.0.1:{canary}"]}}
routes:
  - name: infer
    backends: [{{service: stable, weight: 100}}, {{service: canary, weight: 0}}]
    mirror: {{service: canary, percent: 100}}
rollouts:
  - name: canary-rollout
    route: infer
    stable: stable
    canary: canary
    steps: [10, 100]
    analysis:
      interval: 1s
      metrics:
        - {{name: error-rate, max_increase: 5%}}
        - {{name: output-agreement, min: 99%, via: mirror}}
"""


@pytest.fixture
async def backends(tmp_path: Path) -> AsyncIterator[tuple[BackendHandle, BackendHandle]]:
    async with AsyncExitStack() as stack:
        handles = []
        for name, seed in (("stable", 0), ("canary", 1)):  # other weights: other answers
            build_mlp(tmp_path / name / "mlp" / "1" / "model.onnx", SIZES, seed=seed)
            handles.append(
                await stack.enter_async_context(
                    running_backend(tmp_path / name, ServingSettings(record_outputs=1000))
                )
            )
        yield handles[0], handles[1]


async def test_a_canary_with_other_answers_is_rolled_back_on_output_agreement(
    tmp_path: Path, backends: tuple[BackendHandle, BackendHandle]
) -> None:
    stable, canary = backends
    listener, envoy_admin = free_port(), free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY.format(listener=listener, stable=stable.http_port, canary=canary.http_port)
    )
    gateway: Gateway = await start_gateway(
        GatewayOptions(
            policy_path=policy,
            xds_port=0,
            admin_port=0,
            envoy_admin_port=envoy_admin,
            with_envoy=False,
            workdir=tmp_path / "work",
        )
    )
    envoy = await EnvoyProcess(
        build_bootstrap(node_id="agree", xds_port=gateway.xds.port, admin_port=envoy_admin)
    ).start(wait="ready", timeout=20.0)
    assert gateway.rollouts is not None
    statuses: list[int] = []
    rng = np.random.default_rng(3)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

            async def infer_until_decided() -> dict | None:
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
                try:
                    url = f"http://127.0.0.1:{listener}/v2/models/mlp/infer"
                    async with session.post(url, json=body) as response:
                        await response.read()
                        statuses.append(response.status)
                except aiohttp.ClientError:
                    statuses.append(0)
                status = gateway.rollouts.status("canary-rollout", history=100)  # type: ignore[union-attr]
                return status if status["phase"] in ("rolled_back", "promoted") else None

            status = await poll_until(
                infer_until_decided, timeout=90, what="the rollout to decide", interval=0.01
            )
    finally:
        envoy.stop()
        await gateway.stop()
    assert status["phase"] == "rolled_back", status["reason"]
    assert "output-agreement" in status["reason"], status["reason"]
    rollback = next(d for d in status["history"] if d["action"] == "rollback")
    verdict = next(v for v in rollback["verdicts"] if v["check"] == "output-agreement")
    assert verdict["result"] == "fail" and verdict["inputs"]["canary_events"] >= 5, verdict
    assert set(statuses) == {200}, "a canary with other answers fails no request"
