"""The snapshot cache: per-group snapshots, change notification, node status, NACK records."""

from __future__ import annotations

import pytest

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache, StreamHandle, node_in_sync
from inferway.xds.hooks import XdsObserver
from inferway.xds.snapshot import build_snapshot
from tests.xds_sample import build_sample_resources


def snapshot(backend: int = 9001):
    return build_snapshot(build_sample_resources(listener_port=10000, backend_ports=[backend]))


def node(node_id: str, cluster: str = "edge") -> base_pb2.Node:
    return base_pb2.Node(id=node_id, cluster=cluster)


def ack_all(cache: SnapshotCache, handle, snap) -> None:
    for type_url, version in snap.versions.items():
        cache.record_ack(handle, type_url, version)


def test_set_snapshot_notifies_watchers_of_that_group_only_on_change() -> None:
    cache = SnapshotCache()
    calls: list[str] = []
    cache.create_watch(StreamHandle(1, "a", "edge", "default"), lambda: calls.append("default"))
    cancel = cache.create_watch(
        StreamHandle(2, "b", "edge", "canary"), lambda: calls.append("canary")
    )
    assert cache.set_snapshot(snapshot()) is True
    assert cache.set_snapshot(snapshot()) is False
    assert calls == ["default"]
    assert cache.set_snapshot(snapshot(9002), group="canary") is True
    assert calls == ["default", "canary"]
    assert cache.get_snapshot("canary") == snapshot(9002)
    assert cache.get_snapshot("nobody") is None
    cancel()
    assert cache.set_snapshot(snapshot(9003), group="canary") is True
    assert calls == ["default", "canary"]  # a cancelled watch is not woken


def test_node_group_decides_which_snapshot_a_node_gets() -> None:
    cache = SnapshotCache(node_group=lambda n: "canary" if n.cluster == "canary" else "default")
    assert cache.open_stream(node("a", "canary")).group == "canary"
    assert cache.open_stream(node("b", "stable")).group == "default"


def test_node_status_tracks_connection_acks_and_a_second_stream() -> None:
    clock = iter([100.0, 200.0, 300.0]).__next__
    cache = SnapshotCache(clock=clock)
    first = cache.open_stream(node("envoy-1"))
    cache.record_ack(first, type_urls.CLUSTER, "v1")
    second = cache.open_stream(node("envoy-1"))  # reconnect before the old stream closed
    cache.close_stream(first)
    (status,) = cache.node_status()
    assert status.connected and status.connected_since == 100.0 and status.cluster == "edge"
    assert dict(status.acked) == {type_urls.CLUSTER: "v1"}
    cache.close_stream(second)
    assert not cache.node_status()[0].connected
    with pytest.raises(TypeError):
        status.acked[type_urls.LISTENER] = "x"  # type: ignore[index]


def test_nack_records_are_bounded_and_last_nack_is_kept() -> None:
    cache = SnapshotCache(clock=lambda: 42.0, max_nacks=3)
    handle = cache.open_stream(node("envoy-1"))
    for index in range(5):
        cache.record_nack(handle, type_urls.CLUSTER, f"v{index}", f"n{index}", f"bad {index}")
    assert [r.version for r in cache.nacks()] == ["v2", "v3", "v4"]
    last = cache.node_status()[0].last_nack
    assert last is not None and (last.message, last.at, last.nonce) == ("bad 4", 42.0, "n4")


async def test_wait_for_acks_needs_every_node_and_every_type() -> None:
    cache = SnapshotCache()
    snap = snapshot()
    cache.set_snapshot(snap)
    assert not await cache.wait_for_acks(snap.version, timeout=0.01)  # nobody connected
    one, two = cache.open_stream(node("one")), cache.open_stream(node("two"))
    ack_all(cache, one, snap)
    assert await cache.wait_for_acks(snap.version, node_ids=["one"], timeout=0.01)
    assert not await cache.wait_for_acks(snap.version, timeout=0.01)
    assert not await cache.wait_for_acks(snap.version, node_ids=["one", "ghost"], timeout=0.01)
    for type_url in (type_urls.CLUSTER, type_urls.ENDPOINT, type_urls.LISTENER):
        cache.record_ack(two, type_url, snap.versions[type_url])
    assert not await cache.wait_for_acks(snap.version, timeout=0.01)  # RDS missing
    cache.record_ack(two, type_urls.ROUTE, snap.versions[type_urls.ROUTE])  # SDS: no secrets
    assert await cache.wait_for_acks(snap.version, timeout=0.01)
    assert not await cache.wait_for_acks("other-version", timeout=0.01)


async def test_wait_for_acks_wakes_up_when_the_ack_arrives() -> None:
    import asyncio

    cache = SnapshotCache()
    snap = snapshot()
    cache.set_snapshot(snap)
    handle = cache.open_stream(node("one"))
    waiter = asyncio.create_task(cache.wait_for_acks(snap.version, timeout=5))
    await asyncio.sleep(0)
    assert not waiter.done()
    ack_all(cache, handle, snap)
    assert await asyncio.wait_for(waiter, 1.0)


def test_node_in_sync_needs_every_required_type_acked() -> None:
    cache = SnapshotCache()
    snap = snapshot()
    cache.set_snapshot(snap)
    handle = cache.open_stream(node("envoy-1"))
    assert not node_in_sync(cache.node_status()[0], snap)
    ack_all(cache, handle, snap)
    assert node_in_sync(cache.node_status()[0], snap)
    assert not node_in_sync(cache.node_status()[0], snapshot(9002))
    assert not node_in_sync(cache.node_status()[0], None)


def test_a_nacked_snapshot_is_refused_and_the_group_goes_back_to_the_last_acked_one() -> None:
    cache = SnapshotCache(clock=lambda: 7.0)
    rejections = []

    class Hook(XdsObserver):
        def on_reject(self, rejection) -> None:
            rejections.append(rejection)

    cache.add_hook(Hook())
    woken: list[int] = []
    cache.create_watch(StreamHandle(1, "x", "edge", "default"), lambda: woken.append(1))
    good, bad = snapshot(9001), snapshot(9002)
    cache.set_snapshot(good)
    handle = cache.open_stream(node("envoy-1"))
    ack_all(cache, handle, good)
    assert cache.good_snapshot() == good
    cache.set_snapshot(bad)
    assert cache.good_snapshot() == good  # pushed, not yet accepted
    woken.clear()
    record = cache.record_nack(
        handle, type_urls.ROUTE, "r", "n1", "missing )", snapshot=bad.version, resource_names=("x",)
    )
    assert cache.get_snapshot() == good and woken == [1]  # streams re-sent the good one
    assert cache.is_rejected(bad.version) and not cache.is_rejected(good.version)
    (rejection,) = cache.rejections()
    assert (rejection.version, rejection.restored, rejection.nack) == (
        bad.version,
        good.version,
        record,
    )
    assert rejections == [rejection] and cache.rejection_of(bad.version) == rejection
    # a node connecting now is served the good snapshot too
    late = cache.open_stream(node("envoy-2"))
    assert cache.get_snapshot(late.group) == good
    # the same NACK again (another node) is recorded, not a second rejection
    cache.record_nack(late, type_urls.ROUTE, "r", "n2", "missing )", snapshot=bad.version)
    assert len(cache.rejections()) == 1 and len(cache.nacks()) == 2


def test_a_snapshot_one_node_acked_and_another_nacked_goes_back_to_the_one_before() -> None:
    cache = SnapshotCache()
    first, second = snapshot(9001), snapshot(9002)
    cache.set_snapshot(first)
    one, two = cache.open_stream(node("one")), cache.open_stream(node("two"))
    ack_all(cache, one, first)
    cache.set_snapshot(second)
    ack_all(cache, one, second)
    assert cache.good_snapshot() == second
    cache.record_nack(two, type_urls.CLUSTER, "c", "n", "no", snapshot=second.version)
    assert cache.get_snapshot() == first and cache.good_snapshot() == first


async def test_wait_for_acks_gives_up_as_soon_as_the_snapshot_is_rejected() -> None:
    cache = SnapshotCache()
    cache.set_snapshot(snapshot(9001))
    handle = cache.open_stream(node("one"))
    bad = snapshot(9002)
    cache.set_snapshot(bad)
    cache.record_nack(handle, type_urls.CLUSTER, "c", "n", "no", snapshot=bad.version)
    assert not await cache.wait_for_acks(bad.version, timeout=5)
    # nothing was ever accepted: nothing to go back to, the rejected one stays served
    assert cache.get_snapshot() == bad and cache.rejections()[0].restored is None
