"""Loops decide once: three replica processes share a real 3-member etcd cluster; only the
leader makes decisions; SIGKILL of the leader mid-run hands over within TTL + 1 s; and the
decisions the store holds are one unbroken sequence, each made once, terms never going back
(a deposed leader's write would show as an older term after a newer one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.gateway.fleet.store_url import open_store
from tests.etcd_cluster import EtcdCluster
from tests.fleet_replica import assert_handed_over, kill_the_leader

pytestmark = pytest.mark.needs_binary("etcd", "a real 3-member etcd cluster")

TTL = 2.0


async def test_a_killed_leader_hands_over_within_ttl_and_no_decision_is_made_twice(
    tmp_path: Path,
) -> None:
    async with EtcdCluster(tmp_path, members=3) as cluster:
        url = cluster.url + "/election-test"
        store = open_store(url, workdir=tmp_path)
        try:
            handover = await kill_the_leader(store, url, TTL, tmp_path)
        finally:
            await store.close()
    assert_handed_over(handover, TTL)
