"""The fleet store's contract, one function per promise, each given two handles on one store
(as two replicas have): run against the file and etcd stores by
tests/integration/test_fleet_store.py and against the Kubernetes store (at the client's HTTP
boundary) by tests/unit/test_kubernetes_store.py, so every store keeps the same promises."""

from __future__ import annotations

import asyncio

import pytest

from inferway.gateway.fleet.store import ConflictError, FencedError, Store

__all__ = ["TTL", "compare_and_set", "election_and_fencing", "watch_after_a_version"]

TTL = 2.0


async def compare_and_set(a: Store, b: Store) -> None:
    """A compare-and-set write needs the version it read."""
    first = await a.put("rollouts/model", b"step 1", expect=0)
    with pytest.raises(ConflictError):
        await b.put("rollouts/model", b"also new", expect=0)
    second = await b.put("rollouts/model", b"step 2", expect=first.version)
    with pytest.raises(ConflictError) as lost:
        await a.put("rollouts/model", b"stale step", expect=first.version)
    assert lost.value.found == second.version
    got = await a.get("rollouts/model")
    assert got is not None and got.value == b"step 2" and got.version == second.version
    assert [r.key for r in await b.list("rollouts/")] == ["rollouts/model"]
    assert await a.get("rollouts/other") is None


async def watch_after_a_version(a: Store, b: Store) -> None:
    """A watch sees every write after the version it starts from, in order."""
    before = await a.put("state/weights", b"90/10")
    seen: list[bytes] = []

    async def follow() -> None:
        async for record in b.watch("state/", after=before.version):
            seen.append(record.value)
            if len(seen) == 2:
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.3)
    await a.put("state/weights", b"50/50")
    await a.put("state/phase", b"promoted")
    await asyncio.wait_for(follower, 10)
    assert seen == [b"50/50", b"promoted"]


async def election_and_fencing(a: Store, b: Store) -> None:
    """One replica leads; once another has won, the deposed leader's writes are refused."""
    first = await a.campaign("loops", "replica-a", TTL)
    assert await b.leader("loops") == "replica-a"
    second_task = asyncio.create_task(b.campaign("loops", "replica-b", TTL))
    await asyncio.sleep(0.5)
    assert not second_task.done(), "two replicas lead at once"
    await a.put("decisions/1", b"from a", fence=first.fence)

    await a.resign(first)
    second = await asyncio.wait_for(second_task, 10)
    assert second.fence.term > first.fence.term
    assert await a.leader("loops") == "replica-b"
    with pytest.raises(FencedError):
        await a.put("decisions/2", b"from deposed a", fence=first.fence)
    await b.put("decisions/2", b"from b", fence=second.fence)
    got = await a.get("decisions/2")
    assert got is not None and got.value == b"from b"
