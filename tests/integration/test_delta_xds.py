"""Delta (incremental) ADS against the real Envoy 1.40: config and traffic in both protocols,
an endpoint change that sends exactly one resource and drops no request, and a NACK that is
recorded once and never re-sent. Counts come from the server's own counters (XdsStats)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.server import start_xds_server
from inferway.xds.snapshot import Snapshot, build_snapshot
from tests.integration.endpoints_harness import NODE_ID, EndpointsHarness, poll_until

pytestmark = pytest.mark.integration


@pytest.fixture
async def delta(tmp_path: Path) -> AsyncIterator[EndpointsHarness]:
    harness = await EndpointsHarness.start(tmp_path, mode="delta", backends=4)
    try:
        yield harness
    finally:
        await harness.stop()


@pytest.mark.parametrize("mode", ["sotw", "delta"])
async def test_envoy_gets_config_and_serves_traffic_in_both_protocols(
    tmp_path: Path, mode: str
) -> None:
    harness = await EndpointsHarness.start(tmp_path, mode=mode)  # type: ignore[arg-type]
    try:
        alpha = await harness.send("alpha", 60)
        # round robin per Envoy worker: both replicas get a fair share, nothing fails
        assert set(alpha) == {harness.port(0), harness.port(1)}, alpha
        assert min(alpha.values()) >= 15 and sum(alpha.values()) == 60, alpha
        assert await harness.send("beta", 20) == Counter({harness.port(2): 20})
        other = "delta" if mode == "sotw" else "sotw"
        assert harness.stats.totals(protocol=other).responses == 0
        sent = harness.stats.by_type(mode)
        assert set(sent) == {
            type_urls.CLUSTER,
            type_urls.ENDPOINT,
            type_urls.LISTENER,
            type_urls.ROUTE,
        }
        assert sent[type_urls.CLUSTER].resources >= 2 and sent[type_urls.ENDPOINT].resources >= 2
        status = harness.cache.node_status()[0]
        assert status.node_id == NODE_ID and status.last_nack is None
    finally:
        await harness.stop()


async def test_an_endpoint_change_over_delta_sends_one_resource_and_drops_no_request(
    delta: EndpointsHarness,
) -> None:
    stats_before = await delta.envoy.get_stats("cluster_manager")  # type: ignore[union-attr]
    stop = asyncio.Event()
    failures: Counter[str] = Counter()
    served: Counter[int] = Counter()

    async def steady(service: str) -> None:
        while not stop.is_set():
            try:
                status, port = await delta.request(f"/{service}")
            except Exception as error:  # every failure counts, whatever its kind
                failures[f"{service}: {type(error).__name__}"] += 1
                continue
            if port is None:
                failures[f"{service}: status {status}"] += 1
            else:
                served[port] += 1

    async def slow() -> tuple[int, int | None]:
        return await delta.request("/alpha/slow?ms=1500")

    load = [asyncio.create_task(steady(s)) for s in ("alpha", "alpha", "alpha", "beta")]
    slow_requests = [asyncio.create_task(slow()) for _ in range(4)]
    try:
        await poll_until(
            lambda: sum(b.slow_in_flight for b in delta.backends[:2]) == 4,
            timeout=5,
            what="4 slow requests in flight",
        )
        kept = [i for i in (0, 1) if delta.backends[i].slow_in_flight > 0]
        # Keep every endpoint a slow request is on, drop the other (if any), add backend 3.
        keep = [*kept, 3]
        delta.stats.reset()
        pushes_started = time.monotonic()
        await delta.write_endpoints({"alpha": keep, "beta": [2]})
        propagation = time.monotonic() - pushes_started

        # exactly one resource went out: the one ClusterLoadAssignment that changed
        sent = delta.stats.totals()
        assert (sent.responses, sent.resources, sent.removed) == (1, 1, 0), list(delta.stats)
        assert delta.stats.last is not None
        assert delta.stats.last.type_url == type_urls.ENDPOINT
        assert delta.stats.last.protocol == "delta" and delta.stats.last.node_id == NODE_ID
        assert sent.bytes < 1000 and propagation < 5.0

        await poll_until(
            lambda: served[delta.port(3)] > 5, timeout=5, what="traffic to reach the new endpoint"
        )
        results = await asyncio.wait_for(asyncio.gather(*slow_requests), 10)
        assert all(status == 200 for status, _ in results), results
        assert {port for _, port in results} <= {delta.port(i) for i in kept}
    finally:
        stop.set()
        await asyncio.gather(*load)
        for task in slow_requests:
            task.cancel()
    assert failures == Counter(), f"requests failed during the endpoint change: {failures}"
    assert sum(served.values()) > 100
    stats_after = await delta.envoy.get_stats("cluster_manager")  # type: ignore[union-attr]
    for name in ("cluster_manager.cluster_modified", "cluster_manager.cluster_added"):
        assert stats_after[name] == stats_before[name], f"{name}: a cluster was rebuilt"


def _with_unbuildable_cluster(snapshot: Snapshot, name: str) -> Snapshot:
    """Cluster ``name`` made invalid in a way only Envoy checks: min ring > max ring."""
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


async def test_a_delta_nack_is_recorded_once_and_not_resent(delta: EndpointsHarness) -> None:
    cache = delta.cache
    good = cache.get_snapshot()
    assert good is not None
    bad = _with_unbuildable_cluster(good, "beta")
    delta.stats.reset()
    assert cache.set_snapshot(bad)

    def nacked() -> list[object]:
        return [n for n in cache.nacks() if n.node_id == NODE_ID]

    await poll_until(lambda: bool(nacked()), timeout=10, what="Envoy to NACK the bad cluster")
    [record] = cache.nacks()
    assert record.type_url == type_urls.CLUSTER
    assert record.version == bad.versions[type_urls.CLUSTER]
    assert "minimum_ring_size (4096) > maximum_ring_size (1024)" in record.message
    # the rejected snapshot is refused: the cache serves the last good one again, which sends
    # "beta" once more (good), after the rejected "beta": nothing else went out
    assert cache.get_snapshot() == good
    assert [r.version for r in cache.rejections()] == [bad.version]
    assert cache.is_rejected(bad.version)

    async def sent_good_beta_back() -> bool:
        return delta.stats.totals().responses == 2

    await poll_until(sent_good_beta_back, timeout=5, what="the last good cluster to be re-sent")
    sent = delta.stats.totals()
    assert (sent.responses, sent.resources) == (2, 2), list(delta.stats)

    await asyncio.sleep(1.5)  # a resend loop would push many times a second
    assert delta.stats.totals() == sent, "the rejected cluster was sent again"
    assert len(cache.nacks()) == 1
    alpha = await delta.send("alpha", 20, concurrency=4)
    assert set(alpha) == {delta.port(0), delta.port(1)} and sum(alpha.values()) == 20, alpha

    # the next good change goes through: the node recovers without a restart (an added
    # endpoint; a removed one that still passes active health checks stays until it fails one)
    await delta.write_endpoints({"alpha": [0, 1, 3], "beta": [2]})

    async def reaches_new_endpoint() -> bool:
        return delta.port(3) in await delta.send("alpha", 6, concurrency=2)

    await poll_until(reaches_new_endpoint, timeout=5, what="traffic to reach the added endpoint")


async def test_a_reconnecting_delta_envoy_is_sent_only_what_it_lacks(
    delta: EndpointsHarness,
) -> None:
    """After a control-plane restart Envoy declares what it holds (initial_resource_versions);
    content-derived versions match, so nothing is re-sent, and later changes still flow."""
    assert delta.server is not None
    port = delta.server.port
    await delta.server.stop(grace=0.1)
    delta.server = None
    await poll_until(
        lambda: not delta.cache.node_status()[0].connected, timeout=5, what="the disconnect"
    )
    delta.stats.reset()
    delta.server = await start_xds_server(delta.cache, port=port)
    await poll_until(
        lambda: delta.cache.node_status()[0].connected, timeout=15, what="Envoy to reconnect"
    )
    await poll_until(
        lambda: delta.stats.totals(type_url=type_urls.LISTENER).responses >= 1,
        timeout=10,
        what="the re-subscription to be answered",
    )
    assert delta.stats.totals().resources == 0, list(delta.stats)
    alpha = await delta.send("alpha", 10, concurrency=2)
    assert set(alpha) == {delta.port(0), delta.port(1)}, alpha

    delta.stats.reset()
    await delta.write_endpoints({"alpha": [0, 1, 3], "beta": [2]})
    sent = delta.stats.totals()
    assert (sent.responses, sent.resources) == (1, 1), list(delta.stats)
