"""The data plane outlives its control plane: Envoy keeps serving its last good config when the
control plane dies or sends something it rejects, and resyncs when a control plane is back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway.xds import type_urls
from inferway.xds.hooks import XdsObserver
from inferway.xds.records import NackRecord
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot, build_snapshot
from tests.e2e.conftest import NODE_ID, Gateway, binomial_bounds, poll_until

pytestmark = pytest.mark.integration


async def _envoy_connected(gateway: Gateway) -> int:
    stats = await gateway.envoy.get_stats(r"^control_plane\.connected_state$")
    return stats.get("control_plane.connected_state", -1)


async def _assert_split_unchanged(gateway: Gateway, n: int = 2000) -> None:
    counts = await gateway.send(n)
    low, high = binomial_bounds(n, 0.10)
    assert counts["v1"] + counts["v2"] == n and low <= counts["v2"] <= high, counts


async def test_envoy_serves_without_its_control_plane_and_resyncs_when_it_restarts(
    gateway: Gateway,
) -> None:
    cp = gateway.cp
    port, version = cp.port, cp.version
    envoy_route_version = await gateway.envoy_route_version()

    await cp.stop()
    await poll_until(
        lambda: _is(gateway, 0), timeout=10, what="Envoy to see the control plane gone"
    )
    await _assert_split_unchanged(gateway)

    await cp.start(port=port)  # a fresh cache and ControlPlane, loaded from the same file
    assert cp.port == port
    assert cp.version == version, "versions derive from content, so a restart keeps them"
    acked = await cp.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=20)
    assert acked, f"Envoy did not reconnect and ACK: {cp.cache.node_status()}"
    assert await _envoy_connected(gateway) == 1
    assert await gateway.envoy_route_version() == envoy_route_version

    await gateway.edit({"v1": 0.0, "v2": 100.0})
    assert await gateway.send(200) == Counter({"v2": 200})


async def _is(gateway: Gateway, state: int) -> bool:
    return await _envoy_connected(gateway) == state


class _PushCounter(XdsObserver):
    """Cache hook: every response the server sends, per node and type."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, str, str]] = []

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        self.pushes.append((node_id, type_url, version))


async def _settled(counter: _PushCounter, *, quiet_s: float, timeout: float) -> None:
    """Until no push has been made for ``quiet_s`` seconds (fail after ``timeout``)."""
    seen, since = len(counter.pushes), time.monotonic()

    def quiet() -> bool:
        nonlocal seen, since
        if len(counter.pushes) != seen:
            seen, since = len(counter.pushes), time.monotonic()
        return time.monotonic() - since >= quiet_s

    await poll_until(quiet, timeout=timeout, what=f"the pushes to stop ({counter.pushes})")


def _with_unbuildable_cluster(snapshot: Snapshot, name: str) -> Snapshot:
    """The snapshot with cluster ``name`` made invalid in a way only Envoy checks (the
    translator never produces it): a ring hash whose minimum ring exceeds its maximum."""
    clusters = dict(snapshot.resources_of(type_urls.CLUSTER))
    bad = cluster_pb2.Cluster()
    bad.CopyFrom(clusters[name])
    bad.lb_policy = cluster_pb2.Cluster.RING_HASH
    bad.ring_hash_lb_config.minimum_ring_size.value = 4096
    bad.ring_hash_lb_config.maximum_ring_size.value = 1024
    clusters[name] = bad
    items = {t: list(snapshot.resources_of(t).items()) for t in snapshot.resources.by_type}
    items[type_urls.CLUSTER] = list(clusters.items())
    return build_snapshot(Resources.build(items))


async def test_a_config_envoy_rejects_is_recorded_once_not_resent_and_traffic_keeps_flowing(
    gateway: Gateway,
) -> None:
    cache = gateway.cp.cache
    good = cache.get_snapshot()
    assert good is not None
    acked_before = gateway.cp.acked()
    counter = _PushCounter()
    cache.add_hook(counter)

    bad = _with_unbuildable_cluster(good, "v2")
    bad_cds = bad.versions[type_urls.CLUSTER]
    assert bad.consistent() == [] and bad_cds != good.versions[type_urls.CLUSTER]
    assert cache.set_snapshot(bad)

    def nacked() -> list[NackRecord]:
        return [n for n in cache.nacks() if n.node_id == NODE_ID and n.version == bad_cds]

    await poll_until(lambda: bool(nacked()), timeout=10, what="Envoy to NACK the bad clusters")
    record = nacked()[0]
    assert record.type_url == type_urls.CLUSTER
    assert "minimum_ring_size (4096) > maximum_ring_size (1024)" in record.message, record.message
    status = next(s for s in cache.node_status() if s.node_id == NODE_ID)
    assert status.last_nack == record
    assert status.acked == acked_before, "Envoy must not ACK what it rejected"

    # Refused: the cache serves the last good snapshot again, which re-sends its clusters once.
    assert cache.get_snapshot() == good and cache.is_rejected(bad.version)
    good_cds = (NODE_ID, type_urls.CLUSTER, good.versions[type_urls.CLUSTER])
    await poll_until(lambda: good_cds in counter.pushes, timeout=5, what="the good CDS re-sent")
    assert await cache.wait_for_acks(good.version, node_ids=[NODE_ID], timeout=10)
    pushes_at_ack = len(counter.pushes)
    # Envoy asks for the endpoints again after each clusters response (a cluster it rebuilt
    # re-subscribes), and each ask is answered; on a loaded machine those answers can come
    # after the ACK. What must never come is the rejected config, or pushes that do not stop:
    # a resend loop would push many times a second, so the pushes must settle, then stay
    # settled.
    await _settled(counter, quiet_s=1.0, timeout=10.0)
    settled = len(counter.pushes)
    await asyncio.sleep(2.0)
    assert counter.pushes[settled:] == [], f"pushes kept coming: {counter.pushes[settled:]}"
    later = counter.pushes[pushes_at_ack:]
    assert all(v == good.versions[t] for _, t, v in later), f"rejected config re-sent: {later}"
    assert len(later) <= 4, f"more pushes than Envoy's re-subscriptions explain: {later}"
    assert len(nacked()) == 1
    # the rejected clusters went out once; everything after is the good snapshot's content
    # (its clusters, and the endpoints Envoy asks for again after them)
    assert counter.pushes[0] == (NODE_ID, type_urls.CLUSTER, bad_cds), counter.pushes
    assert all(v == good.versions[t] for _, t, v in counter.pushes[1:]), counter.pushes

    await _assert_split_unchanged(gateway)

    # The next good policy edit goes through: the node recovers without a restart.
    await gateway.edit({"v1": 0.0, "v2": 100.0})
    assert await gateway.send(200) == Counter({"v2": 200})
