"""Admin API over real HTTP on loopback, and the status client's rendering of it."""

from __future__ import annotations

import httpx
import yaml
from rich.console import Console

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.cli.status import render_status
from inferway.gateway.admin import build_admin_app, build_status, start_admin_server
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.supervisor import Backoff
from inferway.policies import PolicyError, PolicyIssue, load_policy_text
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache

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


def plane_with_a_node() -> ControlPlane:
    cache = SnapshotCache()
    plane = ControlPlane(cache)
    plane.apply_policy(load_policy_text(POLICY, "p.yaml"), "p.yaml")
    snapshot = cache.get_snapshot()
    handle = cache.open_stream(base_pb2.Node(id="sidecar-1", cluster="inferway"))
    for type_url in (type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER):
        cache.record_ack(handle, type_url, snapshot.versions[type_url])
    cache.record_nack(handle, type_urls.ROUTE, "bad", "n1", "route rejected: boom")
    return plane


async def test_status_healthz_and_policy_endpoints() -> None:
    plane = plane_with_a_node()
    plane.refuse(PolicyError([PolicyIssue("p.yaml", 3, 5, "listeners[0].port", "bad port")]))
    server = await start_admin_server(build_admin_app(plane), port=0)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            status = (await client.get("/status")).json()
            health = await client.get("/healthz")
            policy = await client.get("/policy")
    finally:
        await server.stop()
    assert status["policy"]["version"] == plane.version
    assert status["policy"]["source"] == "p.yaml"
    [node] = status["nodes"]
    assert node["node_id"] == "sidecar-1" and node["connected"]
    assert not node["in_sync"]  # routes not acked
    assert node["last_nack"]["message"] == "route rejected: boom"
    assert status["nacks"][0]["type"] == "routes"
    refused = status["last_refused"]
    assert refused["pending"] and refused["issues"][0]["line"] == 3
    assert refused["issues"][0]["text"] == "p.yaml:3:5: listeners[0].port: bad port"
    assert status["envoy"] is None
    assert health.status_code == 200 and health.json()["policy_version"] == plane.version
    assert policy.status_code == 200
    assert yaml.safe_load(policy.text)["listeners"][0]["port"] == 10000


async def test_policy_endpoint_is_404_before_any_policy() -> None:
    server = await start_admin_server(build_admin_app(ControlPlane(SnapshotCache())), port=0)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
            response = await client.get("/policy")
    finally:
        await server.stop()
    assert response.status_code == 404


def test_node_is_in_sync_once_every_type_is_acked() -> None:
    plane = plane_with_a_node()
    snapshot = plane.cache.get_snapshot()
    assert not build_status(plane)["nodes"][0]["in_sync"]
    handle = plane.cache.open_stream(base_pb2.Node(id="sidecar-1", cluster="inferway"))
    plane.cache.record_ack(handle, type_urls.ROUTE, snapshot.versions[type_urls.ROUTE])
    assert build_status(plane)["nodes"][0]["in_sync"]


def test_render_status_shows_version_nodes_refusal_and_nacks() -> None:
    plane = plane_with_a_node()
    plane.refuse(PolicyError([PolicyIssue("p.yaml", 3, 5, "listeners[0].port", "bad port")]))
    console = Console(record=True, width=140)
    render_status(build_status(plane), console)
    text = console.export_text()
    assert plane.version[:12] in text
    assert "sidecar-1" in text
    assert "REFUSED" in text and "p.yaml:3:5: listeners[0].port: bad port" in text
    assert "route rejected: boom" in text


def test_backoff_grows_caps_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(initial=0.5, maximum=3.0, factor=2.0, stable_after=10.0)
    delays = []
    previous = None
    for _ in range(5):
        previous = backoff.next_delay(previous, uptime=1.0)
        delays.append(previous)
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.next_delay(3.0, uptime=30.0) == 0.5


def test_healthz_and_status_say_degraded_while_the_last_edit_is_one_envoy_rejected() -> None:
    plane = plane_with_a_node()
    cache = plane.cache
    handle = cache.open_stream(base_pb2.Node(id="sidecar-1", cluster="inferway"))
    good = cache.get_snapshot()
    for type_url, version in good.versions.items():
        cache.record_ack(handle, type_url, version)
    bad = plane.apply_policy(load_policy_text(POLICY.replace("10000", "10001"), "p.yaml"), "p.yaml")
    cache.record_nack(handle, type_urls.LISTENER, "v", "n9", "cannot bind", snapshot=bad)
    status = build_status(plane)
    assert status["health"]["status"] == "degraded: last edit rejected by Envoy"
    assert "cannot bind" in status["health"]["reason"]
    assert status["last_refused"]["rejected_by_envoy"]["restored"] == good.version
    console = Console(record=True, width=200)
    render_status(status, console)
    text = console.export_text()
    assert "degraded: last edit rejected by Envoy" in text and "cannot bind" in text
