"""The gateway's /metrics and /envoy/stats/prometheus over the production wiring (start_gateway:
control plane, watcher, admin API, supervised real Envoy): both parse as Prometheus text, and the
counters move when pushes, ACKs, refused edits and NACKs happen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inferway.gateway.admin import build_admin_app, start_admin_server
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.observability.metric_names import ENVOY_METRICS
from inferway.policies import load_policy_text
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from tests.e2e.conftest import poll_until, render_policy, start_version_backend, write_atomically
from tests.e2e.test_control_plane_restart import _with_unbuildable_cluster
from tests.envoy_process import free_port
from tests.prometheus_text import Samples
from tests.prometheus_text import parse_exposition as parse
from tests.prometheus_text import sample_value as value
from tests.prometheus_text import wire_names as names

pytestmark = pytest.mark.integration


@dataclass
class Stack:
    gateway: Gateway
    client: httpx.AsyncClient
    listener_port: int
    backend_ports: dict[str, int]

    async def metrics(self) -> Samples:
        response = await self.client.get(self.gateway.admin.url + "/metrics")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain")
        return parse(response.text)

    async def envoy_stats(self, **params: str) -> Samples:
        url = self.gateway.admin.url + "/envoy/stats/prometheus"
        response = await self.client.get(url, params=params)
        assert response.status_code == 200, response.text
        return parse(response.text)

    def write(self, weights: dict[str, float | str]) -> None:
        text = render_policy(
            listener_port=self.listener_port, backend_ports=self.backend_ports, weights=weights
        )
        write_atomically(self.gateway.options.policy_path, text)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    runners, ports = [], {}
    for version in ("v1", "v2"):
        runner, port = await start_version_backend(version)
        runners.append(runner)
        ports[version] = port
    listener_port = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(
        render_policy(listener_port=listener_port, backend_ports=ports, weights={"v1": 90.0})
    )
    options = GatewayOptions(
        policy_path=path, xds_port=0, admin_port=0, envoy_admin_port=free_port(), workdir=tmp_path
    )
    gateway = await start_gateway(options)
    client = httpx.AsyncClient(trust_env=False, timeout=5.0)
    try:
        assert gateway.supervisor is not None and await gateway.supervisor.wait_ready(20)
        version = gateway.control_plane.version
        assert version and await gateway.cache.wait_for_acks(version, timeout=10)
        yield Stack(gateway, client, listener_port, ports)
    finally:
        await client.aclose()
        await gateway.stop()
        for runner in runners:
            await runner.cleanup()


async def test_metrics_parse_and_move_with_pushes_acks_refusals_and_nacks(stack: Stack) -> None:
    plane, cache = stack.gateway.control_plane, stack.gateway.cache
    first = await stack.metrics()
    assert value(first, "inferway_policy_info", version=plane.version or "") == 1
    assert value(first, "inferway_policy_applied_total") == 1
    assert value(first, "inferway_xds_connected_envoys") == 1
    assert value(first, "inferway_xds_envoys_in_sync") == 1
    for kind in ("clusters", "endpoints", "listeners", "routes"):
        assert value(first, "inferway_xds_pushes_total", type=kind) >= 1, kind
        assert value(first, "inferway_xds_acks_total", type=kind) >= 1, kind
        assert value(first, "inferway_xds_push_duration_seconds_count", type=kind) >= 1, kind
    assert value(first, "inferway_xds_nacks_total") == 0
    assert value(first, "inferway_policy_refused_edits_total") == 0

    # A valid edit: applied, pushed, ACKed, propagated.
    before = plane.version
    stack.write({"v1": 50.0, "v2": 50.0})
    await poll_until(lambda: plane.version != before, timeout=10, what="the edit to apply")
    assert await cache.wait_for_acks(plane.version or "", timeout=10)
    edited = await stack.metrics()
    assert value(edited, "inferway_policy_applied_total") == 2
    assert value(edited, "inferway_policy_info", version=plane.version or "") == 1
    assert value(edited, "inferway_policy_info", version=before or "") == 0
    assert value(edited, "inferway_policy_propagation_seconds_count") == 1
    assert value(edited, "inferway_xds_pushes_total") > value(first, "inferway_xds_pushes_total")
    assert value(edited, "inferway_xds_acks_total") > value(first, "inferway_xds_acks_total")

    # A refused edit (weight below the resolution): counted, pending, nothing pushed.
    stack.write({"v1": 90.0, "v2": "0.05"})
    await poll_until(lambda: plane.refusal_pending, timeout=10, what="the edit to be refused")
    refused = await stack.metrics()
    assert value(refused, "inferway_policy_refused_edits_total") == 1
    assert value(refused, "inferway_policy_refusal_pending") == 1
    assert value(refused, "inferway_policy_applied_total") == 2
    assert value(refused, "inferway_xds_pushes_total") == value(edited, "inferway_xds_pushes_total")

    # A snapshot Envoy rejects, set straight into the cache: one NACK of clusters; the cache
    # goes back to the last good snapshot and the Envoy is in sync with it again.
    (node,) = cache.node_status()  # ``default|sse`` where Envoy's SSE module built
    good = cache.get_snapshot(node.group)
    assert good is not None
    assert cache.set_snapshot(_with_unbuildable_cluster(good, "v2"), node.group)
    await poll_until(lambda: bool(cache.nacks()), timeout=10, what="Envoy to NACK")
    assert cache.get_snapshot(node.group) == good
    assert await cache.wait_for_acks(good.version, timeout=10)
    nacked = await stack.metrics()
    assert value(nacked, "inferway_xds_nacks_total", type="clusters") == 1
    assert value(nacked, "inferway_xds_nacks_total") == 1
    assert value(nacked, "inferway_xds_envoys_in_sync") == 1


async def test_envoy_stats_come_through_the_gateway_with_the_names_the_dashboard_uses(
    stack: Stack,
) -> None:
    stack.write({"v1": 50.0, "v2": 50.0})
    plane = stack.gateway.control_plane
    await poll_until(
        lambda: plane.policy is not None and len(plane.policy.routes[0].backends) == 2,
        timeout=10,
        what="the two-version policy to apply",
    )
    assert await stack.gateway.cache.wait_for_acks(plane.version or "", timeout=10)
    n = 60
    url = f"http://127.0.0.1:{stack.listener_port}/v2/models/demo/infer"
    statuses = [(await stack.client.get(url)).status_code for _ in range(n)]
    assert statuses == [200] * n

    # Counters are live; histograms reach /stats after Envoy's stats flush (5 s by default).
    async def flushed() -> bool:
        stats = await stack.envoy_stats()
        return value(stats, "envoy_vhost_route_upstream_rq_time_count", envoy_route="models") >= n

    await poll_until(flushed, timeout=15, what="Envoy's histograms to flush")
    stats = await stack.envoy_stats()
    missing = ENVOY_METRICS - names(stats)
    assert not missing, f"Envoy 1.40 does not emit {sorted(missing)}"
    per_version = {
        v: value(stats, "envoy_cluster_upstream_rq_total", envoy_cluster_name=v)
        for v in ("v1", "v2")
    }
    assert sum(per_version.values()) == n and min(per_version.values()) > 0, per_version
    assert value(stats, "envoy_cluster_upstream_rq_xx", envoy_response_code_class="2") >= n
    route = {"envoy_virtual_host": "edge", "envoy_route": "models"}
    assert value(stats, "envoy_vhost_route_upstream_rq_total", **route) == n
    assert value(stats, "envoy_control_plane_connected_state") == 1

    # Envoy's own query parameters pass through.
    filtered = await stack.envoy_stats(filter="^cluster\\.v1\\.upstream_rq_total$")
    assert names(filtered) == {"envoy_cluster_upstream_rq_total"}


POLICY = """\
listeners:
  - name: public
    port: 10000
services:
  - name: model-v1
    endpoints: ["127.0.0.1:8001"]
routes:
  - name: inference
    backends:
      - service: model-v1
"""


async def test_envoy_stats_without_envoy_say_why_and_metrics_still_serve() -> None:
    plane = ControlPlane(SnapshotCache())
    app = build_admin_app(plane)  # attaches its own metrics, so the apply below is counted
    plane.apply_policy(load_policy_text(POLICY, "p.yaml"), "p.yaml")
    server = await start_admin_server(app, port=0)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            envoy = await client.get("/envoy/stats/prometheus")
            metrics = parse((await client.get("/metrics")).text)
    finally:
        await server.stop()
    assert envoy.status_code == 404 and "no Envoy" in envoy.text
    assert value(metrics, "inferway_policy_applied_total") == 1
    assert value(metrics, "inferway_xds_connected_envoys") == 0
    assert (
        value(metrics, "inferway_xds_pushes_total", type=type_urls.SHORT_NAMES[type_urls.ROUTE])
        == 0
    )
