"""The autoscaling loop closed over real processes: the gateway's composition root with a real
Envoy, replicas of a deliberately slow server (each request sleeps), bounded load on loopback
stepped up then down. The service scales out, then in after the cooldown, with no failed
request; every decision is in GET /autoscale, the desired count in /metrics and in
``inferway scale status -o json``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.gateway.runtime import Gateway
from tests.envoy_process import free_port
from tests.gateway_process import replica_counts, running_gateway
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

POLICY = """
listeners: [{{name: edge, port: {listener}}}]
services:
  - name: model
    health_check: {{interval: 250ms}}
    replicas:
      command: {python} {server} --port {{port}} --delay 0.2
      min: 1
      max: 3
      ready_timeout: 20s
      drain_timeout: 10s
      stop_grace: 5s
    autoscale:
      algorithm: proportional
      metric: in_flight
      target: 2
      sampling_interval: 0.5
      min_replicas: 1
      max_replicas: 3
      cooldown: {{up: 0.5, down: 1}}
      stabilization: {{down: 1}}
      panic: {{enabled: false}}
routes:
  - name: all
    backends: [{{service: model}}]
"""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, int]]:
    listener = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(
        POLICY.format(
            listener=listener, python=sys.executable, server=ROOT / "tests" / "replica_server.py"
        )
    )
    async with running_gateway(path, tmp_path) as gw:
        yield gw, listener


async def test_load_scales_out_then_in_after_the_cooldown_without_a_failed_request(
    gateway: tuple[Gateway, int],
) -> None:
    gw, listener = gateway
    assert gw.autoscale is not None
    seen: list[dict[str, Any]] = []
    gw.autoscale.on_decision.append(seen.append)
    await poll_until(lambda: replica_counts(gw) == (1, 1), timeout=30, what="one ready replica")

    failures: list[str] = []
    answered = 0
    loading = True
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:

        async def user() -> None:  # a closed loop: at most one request in flight each
            nonlocal answered
            while loading:
                try:
                    response = await client.get(f"http://127.0.0.1:{listener}/infer")
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    continue
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:80]}")
                else:
                    answered += 1

        users = [asyncio.create_task(user()) for _ in range(6)]
        try:  # 6 in flight at 2 per replica: 3 replicas, all serving
            await poll_until(
                lambda: replica_counts(gw) == (3, 3), timeout=40, what="scale out to 3"
            )
        finally:
            loading = False
            await asyncio.gather(*users)
    await poll_until(lambda: replica_counts(gw) == (1, 1), timeout=40, what="scale in to 1")

    assert failures == [] and answered > 0
    directions = [d["direction"] for d in seen]
    assert "up" in directions and "down" in directions
    assert directions.index("down") > directions.index("up")
    up = next(d for d in seen if d["direction"] == "up")
    assert up["inputs"]["in_flight"] > 2 and up["metric"] == "in_flight"

    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as admin:
        document = (await admin.get(f"{gw.admin.url}/autoscale")).json()
        metrics = (await admin.get(f"{gw.admin.url}/metrics")).text
    shown = document["decisions"]
    # every decision seen, in order (one may precede the hook, made while the fixture's
    # replica was still starting, and more may have come since)
    assert seen[0] in shown, (seen[0], shown)
    first = shown.index(seen[0])
    assert shown[first : first + len(seen)] == seen
    (service,) = document["services"]
    assert service["service"] == "model" and service["error"] is None
    assert document["replicas"]["services"][0]["ready"] == 1
    scaled = [e for e in document["replicas"]["events"] if e["kind"] == "scaled"]
    assert {e["desired"] for e in scaled} >= {3, 1}
    assert 'inferway_autoscale_desired_replicas{service="model"} 1.0' in metrics

    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["scale", "status", "--admin", gw.admin.url, "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["services"][0]["last_decision"]["desired"] == 1
    text = await asyncio.to_thread(
        CliRunner().invoke, app, ["scale", "status", "--admin", gw.admin.url]
    )
    assert text.exit_code == 0 and "model  proportional on in_flight" in text.output
