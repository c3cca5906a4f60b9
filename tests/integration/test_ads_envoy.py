"""The ADS server against the real Envoy 1.40: ACKs, traffic, a NACK that sends the last good
snapshot again once and then nothing (no retry loop),
a cluster update that does not strand EDS, and a control-plane restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from aiohttp import web
from google.protobuf import duration_pb2, wrappers_pb2

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway.xds import type_urls
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.hooks import XdsObserver
from inferway.xds.server import start_xds_server
from inferway.xds.snapshot import Snapshot, build_snapshot
from tests.aiohttp_sites import start_site
from tests.envoy_process import EnvoyProcess, free_port
from tests.xds_sample import build_sample_resources

pytestmark = pytest.mark.integration

NODE = "ads-test-envoy"
BODY = "hello from the backend"


async def start_backend(body: str) -> tuple[web.AppRunner, int]:
    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    return await start_site(app)


@pytest.fixture
async def backend_port() -> AsyncIterator[int]:
    runner, port = await start_backend(BODY)
    try:
        yield port
    finally:
        await runner.cleanup()


class PushCounter(XdsObserver):
    def __init__(self) -> None:
        self.pushes: list[tuple[str, str]] = []

        self.by_node: dict[str, int] = {}

    def on_push(self, node_id: str, type_url: str, version: str, count: int) -> None:
        self.pushes.append((type_url, version))
        self.by_node[node_id] = self.by_node.get(node_id, 0) + 1


def good_snapshot(
    listener_port: int, backend_port: int, connect_timeout_ms: int = 1000
) -> Snapshot:
    snapshot = build_snapshot(
        build_sample_resources(
            listener_port=listener_port,
            backend_ports=[backend_port],
            connect_timeout_ms=connect_timeout_ms,
        )
    )
    assert snapshot.consistent() == []
    return snapshot


def ring_hash_cluster_envoy_rejects() -> cluster_pb2.Cluster:
    """Valid protobuf, rejected by Envoy at runtime: minimum_ring_size > maximum_ring_size."""
    return cluster_pb2.Cluster(
        name="bad_ring",
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=duration_pb2.Duration(seconds=1),
        lb_policy=cluster_pb2.Cluster.RING_HASH,
        ring_hash_lb_config=cluster_pb2.Cluster.RingHashLbConfig(
            minimum_ring_size=wrappers_pb2.UInt64Value(value=4096),
            maximum_ring_size=wrappers_pb2.UInt64Value(value=16),
        ),
    )


async def get_through_envoy(port: int, timeout: float = 10.0) -> httpx.Response:
    """GET through Envoy's listener, retrying until a 200 or the deadline."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            try:
                response = await client.get(f"http://127.0.0.1:{port}/hello")
                if response.status_code == 200 or time.monotonic() > deadline:
                    return response
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)


async def poll(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_envoy_acks_serves_traffic_and_a_nack_is_recorded_without_retry_loop(
    backend_port: int,
) -> None:
    cache = SnapshotCache()
    counter = PushCounter()
    cache.add_hook(counter)
    listener_port = free_port()
    good = good_snapshot(listener_port, backend_port)
    cache.set_snapshot(good)
    server = await start_xds_server(cache)
    bootstrap = build_bootstrap(node_id=NODE, xds_port=server.port, admin_port=0)
    try:
        async with EnvoyProcess(bootstrap) as envoy:
            assert await cache.wait_for_acks(good.version, node_ids=[NODE], timeout=15)
            (status,) = cache.node_status()
            assert status.connected and status.cluster == "inferway"
            assert set(status.acked) == {
                type_urls.CLUSTER,
                type_urls.ENDPOINT,
                type_urls.LISTENER,
                type_urls.ROUTE,
            }
            response = await get_through_envoy(listener_port)
            assert (response.status_code, response.text) == (200, BODY)

            bad = build_snapshot(
                build_sample_resources(
                    listener_port=listener_port,
                    backend_ports=[backend_port],
                    extra_clusters=[ring_hash_cluster_envoy_rejects()],
                )
            )
            assert cache.set_snapshot(bad)
            await poll(lambda: cache.nacks(), 10, "Envoy to NACK the bad clusters")
            (nack,) = cache.nacks()
            assert (nack.node_id, nack.type_url) == (NODE, type_urls.CLUSTER)
            assert nack.version == bad.versions[type_urls.CLUSTER]
            assert "ring" in nack.message.lower(), nack.message
            assert cache.node_status()[0].last_nack == nack
            assert (
                cache.node_status()[0].acked[type_urls.CLUSTER] == good.versions[type_urls.CLUSTER]
            )
            # Refused: the cache serves the last good snapshot again (one CDS push of it).
            assert cache.get_snapshot() == good and cache.is_rejected(bad.version)
            good_cds = (type_urls.CLUSTER, good.versions[type_urls.CLUSTER])
            await poll(lambda: counter.pushes[-1] == good_cds, 5, "the good clusters re-sent")
            pushes_after_nack = len(counter.pushes)
            # Absence of a retry loop can only be shown by watching for a while.
            await asyncio.sleep(2.0)
            assert len(counter.pushes) == pushes_after_nack
            assert len(cache.nacks()) == 1
            stats = await envoy.get_stats("cluster_manager.cds")
            assert stats["cluster_manager.cds.update_rejected"] == 1
            response = await get_through_envoy(listener_port)
            assert (response.status_code, response.text) == (200, BODY)

            # A good cluster change (same EDS) is applied and does not strand the cluster warming.
            fixed = good_snapshot(listener_port, backend_port, connect_timeout_ms=250)
            assert cache.set_snapshot(fixed)
            # Envoy rebuilds "backend", asks again for its endpoints, and only then ACKs CDS.
            assert await cache.wait_for_acks(fixed.version, node_ids=[NODE], timeout=10)

            async def no_warming_clusters() -> bool:
                gauges = await envoy.get_stats("cluster_manager.warming_clusters")
                return gauges.get("cluster_manager.warming_clusters") == 0

            await envoy.wait_for(no_warming_clusters, timeout=10, what="no warming clusters")
            dump = await envoy.config_dump("dynamic_active_clusters")
            timeouts = {
                c["cluster"]["name"]: c["cluster"]["connect_timeout"] for c in dump["configs"]
            }
            assert timeouts == {"backend": "0.250s"}
            response = await get_through_envoy(listener_port)
            assert (response.status_code, response.text) == (200, BODY)
    finally:
        await server.stop(0)
    await poll(lambda: not cache.node_status()[0].connected, 5, "the node to disconnect")


async def test_envoy_keeps_serving_without_the_control_plane_and_reconnects_to_a_new_one(
    backend_port: int,
) -> None:
    cache = SnapshotCache()
    listener_port = free_port()
    snapshot = good_snapshot(listener_port, backend_port)
    cache.set_snapshot(snapshot)
    server = await start_xds_server(cache)
    port = server.port
    bootstrap = build_bootstrap(node_id=NODE, xds_port=port, admin_port=0)
    replacement = None
    try:
        async with EnvoyProcess(bootstrap):
            assert await cache.wait_for_acks(snapshot.version, timeout=15)
            await server.stop(0)
            await poll(lambda: not cache.node_status()[0].connected, 5, "the node to disconnect")
            response = await get_through_envoy(listener_port)
            assert (response.status_code, response.text) == (200, BODY)

            fresh = SnapshotCache()
            fresh.set_snapshot(good_snapshot(listener_port, backend_port))
            replacement = await start_xds_server(fresh, port=port)
            assert await fresh.wait_for_acks(snapshot.version, node_ids=[NODE], timeout=20)
            assert fresh.nacks() == []
            response = await get_through_envoy(listener_port)
            assert (response.status_code, response.text) == (200, BODY)
    finally:
        await server.stop(0)
        if replacement is not None:
            await replacement.stop(0)


async def test_two_envoys_in_two_groups_get_their_own_snapshots(backend_port: int) -> None:
    canary_runner, canary_backend = await start_backend("canary")
    cache = SnapshotCache(node_group=lambda node: node.cluster)
    counter = PushCounter()
    cache.add_hook(counter)
    stable_port, canary_port = free_port(), free_port()
    stable = good_snapshot(stable_port, backend_port)
    cache.set_snapshot(stable, group="stable")
    cache.set_snapshot(good_snapshot(canary_port, canary_backend), group="canary")
    server = await start_xds_server(cache)
    boots = {
        group: build_bootstrap(
            node_id=f"envoy-{group}", node_cluster=group, xds_port=server.port, admin_port=0
        )
        for group in ("stable", "canary")
    }
    try:
        async with EnvoyProcess(boots["stable"]), EnvoyProcess(boots["canary"]):
            stable_body = (await get_through_envoy(stable_port)).text
            canary_body = (await get_through_envoy(canary_port)).text
            assert (stable_body, canary_body) == (BODY, "canary")
            assert {s.node_id: s.group for s in cache.node_status()} == {
                "envoy-canary": "canary",
                "envoy-stable": "stable",
            }
            assert await cache.wait_for_acks(stable.version, node_ids=["envoy-stable"], timeout=10)
            stable_pushes = counter.by_node["envoy-stable"]
            moved = good_snapshot(canary_port, backend_port)  # canary now routes to stable
            assert cache.set_snapshot(moved, group="canary")
            assert await cache.wait_for_acks(moved.version, node_ids=["envoy-canary"], timeout=10)
            assert (await get_through_envoy(canary_port)).text == BODY
            assert counter.by_node["envoy-stable"] == stable_pushes
    finally:
        await server.stop(0)
        await canary_runner.cleanup()
