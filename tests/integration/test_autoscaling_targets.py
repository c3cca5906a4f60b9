"""Autoscaling services whose replicas something else runs, over real processes: the
gateway's composition root with a real Envoy, two slow backends (each request sleeps 0.2 s)
started by the test, closed-loop load on loopback.

``published`` (``scale_target: metric``, no ``replicas:``) lists both backends and a port
where nothing listens: the current count is the hosts Envoy holds healthy (2, not the 3
listed), and the decisions are published in the gateway's /metrics and ``GET /autoscale`` as
load rises and falls, as KEDA or an HPA would read them. ``deployed`` (``scale_target:
{kubernetes: ...}``) is sized by patching a Deployment's scale subresource through the real
kubernetes client, whose HTTP pool is one Deployment's Scale (tests/kubernetes_pool.py: no
API server can run here): the loop reads the count from the Scale, a 403 on the first PATCH
is the service's error (not a crash), the next decision's PATCH goes through."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.gateway.actuators.kubernetes_scale import ScaleTarget
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from tests.envoy_process import free_port
from tests.helpers import poll_until
from tests.kubernetes_pool import HOST, ScalePool, scaler_on

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

RULE = """      algorithm: proportional
      metric: in_flight
      target: 2
      sampling_interval: 0.5
      min_replicas: 1
      max_replicas: 6
      cooldown: {{up: 0.5, down: 1}}
      stabilization: {{down: 1}}
      panic: {{enabled: false}}
"""
POLICY = (
    """
listeners: [{{name: edge, port: {listener}}}]
services:
  - name: published
    endpoints: [{{host: 127.0.0.1, port: {a}}}, {{host: 127.0.0.1, port: {b}}},
                {{host: 127.0.0.1, port: {dead}}}]
    health_check: {{interval: 250ms}}
    autoscale:
      scale_target: metric
"""
    + RULE
    + """  - name: deployed
    endpoints: [{{host: 127.0.0.1, port: {a}}}, {{host: 127.0.0.1, port: {b}}}]
    health_check: {{interval: 250ms}}
    autoscale:
      scale_target: {{kubernetes: {{deployment: inferway-backend, namespace: inferway}}}}
"""
    + RULE
    + """routes:
  - {{name: p, match: {{path: {{prefix: /published}}}}, backends: [{{service: published}}]}}
  - {{name: d, match: {{path: {{prefix: /deployed}}}}, backends: [{{service: deployed}}]}}
"""
)


async def _backend(port: int) -> asyncio.subprocess.Process:
    server = ROOT / "tests" / "replica_server.py"
    return await asyncio.create_subprocess_exec(
        sys.executable, str(server), "--port", str(port), "--delay", "0.2",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, int, ScalePool]]:
    a, b, dead, listener = free_port(), free_port(), free_port(), free_port()
    backends = [await _backend(a), await _backend(b)]
    pool = ScalePool("inferway-backend", "inferway", spec=1, ready=1, refuse=[403])
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(listener=listener, a=a, b=b, dead=dead))

    def kubernetes(service: str, target: ScaleTarget) -> Any:
        return scaler_on(pool, service, target)

    options = GatewayOptions(
        policy_path=path,
        xds_port=0,
        admin_port=0,
        envoy_admin_port=free_port(),
        workdir=tmp_path,
        kubernetes=kubernetes,
    )
    try:
        gw = await start_gateway(options)
        try:
            assert gw.supervisor is not None and await gw.supervisor.wait_ready(20)
            yield gw, listener, pool
        finally:
            await gw.stop()
    finally:
        for backend in backends:
            backend.terminate()
            await backend.wait()


def _service(gw: Gateway, name: str) -> dict[str, Any]:
    assert gw.autoscale is not None
    return next(s for s in gw.autoscale.status_json()["services"] if s["service"] == name)


def _last(gw: Gateway, name: str) -> dict[str, Any] | None:
    last: dict[str, Any] | None = _service(gw, name)["last_decision"]
    return last


def _published(metrics: str, service: str) -> float | None:
    pattern = rf'^inferway_autoscale_desired_replicas\{{service="{service}"\}} (\S+)$'
    found = re.search(pattern, metrics, re.MULTILINE)
    return None if found is None else float(found.group(1))


async def test_metric_and_kubernetes_targets_follow_load_without_replicas(
    gateway: tuple[Gateway, int, ScalePool],
) -> None:
    gw, listener, pool = gateway
    assert gw.autoscale is not None and gw.replicas is not None
    assert gw.replicas.status() == ()  # nothing runs here: both are sized elsewhere
    seen: list[dict[str, Any]] = []
    gw.autoscale.on_decision.append(seen.append)
    # Envoy's active health checks leave the dead port out: 2 healthy hosts of 3 listed.
    await poll_until(
        lambda: (_last(gw, "published") or {}).get("current") == 2,
        timeout=30,
        what="a decision on Envoy's 2 healthy hosts",
    )

    failures: list[str] = []
    loading = True
    async with (
        httpx.AsyncClient(trust_env=False, timeout=10.0) as client,
        httpx.AsyncClient(trust_env=False, timeout=5.0) as admin,
    ):

        async def user(prefix: str) -> None:  # closed loop: one request in flight each
            while loading:
                try:
                    response = await client.get(f"http://127.0.0.1:{listener}/{prefix}")
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    continue
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:80]}")

        async def desired_published() -> float | None:
            return _published((await admin.get(f"{gw.admin.url}/metrics")).text, "published")

        users = [asyncio.create_task(user(p)) for p in ("published", "deployed") for _ in range(8)]
        try:  # 8 in flight over 2 hosts at a target of 2 each: 4 wanted
            await poll_until(
                lambda: (_last(gw, "published") or {}).get("desired", 0) >= 3,
                timeout=30,
                what="a scale-out decision for published",
            )
            assert (await desired_published() or 0) >= 3
            await poll_until(lambda: pool.spec > 1, timeout=30, what="a PATCH that went through")
        finally:
            loading = False
            await asyncio.gather(*users)

        await poll_until(
            lambda: (_last(gw, "published") or {}).get("desired") == 1,
            timeout=30,
            what="published back to its minimum once the load stops",
        )
        metrics = (await admin.get(f"{gw.admin.url}/metrics")).text
        document = (await admin.get(f"{gw.admin.url}/autoscale")).json()

    assert failures == []
    assert _published(metrics, "published") == 1.0
    published = [d for d in seen if d["service"] == "published"]
    # before the first health checks pass Envoy holds no healthy host (current 0); after,
    # the two backends (the dead port never counts)
    # (a backend slow under the load may miss a health check for a moment: never more than 2)
    first = next(i for i, d in enumerate(published) if d["current"] == 2)
    assert {d["current"] for d in published[:first]} <= {0, 1}
    assert max(d["current"] for d in published) == 2, "the dead port never counts"
    assert all(d["scale_target"] == "metric" for d in published)
    up = next(d for d in published[first:] if d["direction"] == "up")
    assert up["inputs"]["in_flight"] > 4 and up["desired"] >= 3

    # deployed: counts from the Scale, the first PATCH refused (shown, logged), then applied
    deployed = [d for d in seen if d["service"] == "deployed"]
    refused = next(d for d in deployed if "error" in d)
    assert (
        "not allowed to patch deployment inferway/inferway-backend/scale (403" in (refused["error"])
    )
    assert refused["current"] == 1 and refused["desired"] > 1
    patches = pool.patches()
    assert len(patches) >= 2
    for patch in patches:
        assert patch.url == HOST + pool.path
        assert patch.headers["Content-Type"] == "application/merge-patch+json"
    after = deployed[deployed.index(refused) + 1 :]
    applied = next(d for d in after if d["desired"] != d["current"])
    assert "error" not in applied and applied["current"] == 1  # the refused PATCH changed nothing
    assert patches[1].body == {"spec": {"replicas": applied["desired"]}}
    assert any(d["current"] == applied["desired"] for d in after)  # read back from the Scale

    shown = {s["service"]: s for s in document["services"]}
    assert shown["published"]["scale_target"] == {"kind": "metric"}
    assert shown["deployed"]["scale_target"]["kind"] == "kubernetes"
    # The document keeps every decision the hook saw, in order. It may begin with decisions made
    # before the hook was attached (the loop runs from the gateway's start), and the hook may
    # have seen a few made after the document was read.
    kept = document["decisions"]
    start = next((i for i, d in enumerate(kept) if d == seen[0]), None)
    assert start is not None, "the first decision the hook saw is in the document"
    assert kept[start:] == seen[: len(kept) - start]

    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["scale", "status", "--admin", gw.admin.url, "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    targets = {s["service"]: s["scale_target"] for s in json.loads(result.output)["services"]}
    assert targets["deployed"]["deployment"] == "inferway-backend"
    text = await asyncio.to_thread(
        CliRunner().invoke, app, ["scale", "status", "--admin", gw.admin.url]
    )
    assert text.exit_code == 0, text.output
    assert "published  proportional on in_flight  -> published metric" in text.output
    assert "-> deployment inferway/inferway-backend" in text.output
