"""The fleet's store, on the embedded ``file:`` store and on a real 3-member etcd cluster: one
contract (tests/store_contract.py: versioned records, compare-and-set, watches, an election
whose fence refuses a deposed leader's writes), then what only a cluster shows (a leader cut
off from its quorum stops deciding before anyone else can start; a lost member changes
nothing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inferway.gateway.fleet.etcd_store import EtcdStore
from inferway.gateway.fleet.store import FencedError, Store
from inferway.gateway.fleet.store_url import open_store, parse_etcd_endpoints
from tests.etcd_cluster import EtcdCluster
from tests.store_contract import TTL, compare_and_set, election_and_fencing, watch_after_a_version


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(tmp_path, members=3) as running:
        yield running


def _open(kind: str, tmp_path: Path, cluster_url: str | None) -> Store:
    if kind == "file":
        return open_store(f"file:{tmp_path / 'store'}", workdir=tmp_path)
    assert cluster_url is not None
    return open_store(cluster_url + "/test", workdir=tmp_path)


@pytest.fixture(params=["file", "etcd"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[list[Store]]:
    """Two handles on one store, as two replicas would have."""
    if request.param == "file":
        opened = [_open("file", tmp_path, None) for _ in range(2)]
        yield opened
    else:
        async with EtcdCluster(tmp_path, members=3) as running:
            opened = [_open("etcd", tmp_path, running.url) for _ in range(2)]
            yield opened
            for store in opened:
                await store.close()
        return
    for store in opened:
        await store.close()


async def test_a_compare_and_set_write_needs_the_version_it_read(stores: list[Store]) -> None:
    await compare_and_set(*stores)


async def test_a_watch_sees_every_write_after_the_version_it_starts_from(
    stores: list[Store],
) -> None:
    await watch_after_a_version(*stores)


async def test_one_replica_leads_and_a_deposed_leaders_writes_are_refused(
    stores: list[Store],
) -> None:
    await election_and_fencing(*stores)


async def test_a_killed_leaders_lease_runs_out_and_another_takes_over_within_ttl_plus_1s(
    cluster: EtcdCluster,
) -> None:
    endpoints, prefix = parse_etcd_endpoints(cluster.url + "/kill")
    a, b = EtcdStore(endpoints, prefix), EtcdStore(endpoints, prefix)
    try:
        await a.campaign("loops", "replica-a", TTL)
        # a process killed: its keep-alives stop, nothing is revoked
        for task in list(a._keepalives.values()):
            task.cancel()
        killed = time.monotonic()
        led = await asyncio.wait_for(b.campaign("loops", "replica-b", TTL), 10)
        took = time.monotonic() - killed
        assert led.fence.identity == "replica-b"
        assert took < TTL + 1.0, f"failover took {took:.2f}s"
    finally:
        await a.close()
        await b.close()


async def test_a_leader_cut_off_from_etcd_stops_deciding_before_another_starts(
    cluster: EtcdCluster,
) -> None:
    # replica a reaches member 0 only, replica b the two others; then member 0 stops answering
    a = EtcdStore([("127.0.0.1", cluster.client_ports[0])], "/cut", timeout=0.5)
    b = EtcdStore([("127.0.0.1", p) for p in cluster.client_ports[1:]], "/cut", timeout=0.5)
    try:
        leadership = await a.campaign("loops", "replica-a", TTL)
        cluster.pause(0)
        cut = time.monotonic()
        lost_at: list[float] = []

        async def note_loss() -> None:
            await leadership.lost.wait()
            lost_at.append(time.monotonic())

        watching = asyncio.create_task(note_loss())
        led = await asyncio.wait_for(b.campaign("loops", "replica-b", TTL), 20)
        won_at = time.monotonic()
        await asyncio.wait_for(watching, 1)
        assert lost_at[0] < won_at, "the new leader started while the old one still decided"
        assert lost_at[0] - cut <= TTL + 0.5, f"a kept deciding {lost_at[0] - cut:.2f}s"
        assert won_at - cut < 2 * TTL + 1.5, f"b waited {won_at - cut:.2f}s"
        assert led.fence.term > leadership.fence.term
        cluster.resume(0)
        # the member a reaches rejoins first (it was cut off through an election); then a's
        # late write reaches etcd and the fence refuses it
        await cluster.wait_healthy([0])
        with pytest.raises(FencedError):
            await a.put("decisions/late", b"x", fence=leadership.fence)
        await b.put("decisions/next", b"y", fence=led.fence)
    finally:
        cluster.resume(0)
        await a.close()
        await b.close()


async def test_the_store_keeps_answering_with_one_member_down(cluster: EtcdCluster) -> None:
    store = open_store(cluster.url, workdir=Path("."))
    try:
        await store.put("k", b"1")
        cluster.stop(0)
        record = await store.put("k", b"2")
        assert record.value == b"2"
        health = await store.health()
        assert health.ok
        assert sum("unreachable" in m for m in health.members) == 1
    finally:
        await store.close()
