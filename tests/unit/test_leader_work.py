"""LeaderWork on the embedded file: store: one of two replicas leads and runs the leader-only
tasks; a failing task is restarted and its failure shown; stopping the leader hands over at
once; a write fenced off ends the leadership instead of looping."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferway.gateway.fleet import election
from inferway.gateway.fleet.election import LeaderWork
from inferway.gateway.fleet.file_store import FileStore
from inferway.gateway.fleet.store import Fence, FencedError


async def _until(condition: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_one_replica_runs_the_tasks_and_a_stopped_leader_hands_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(election, "RESTART_S", 0.05)
    ran: list[tuple[str, int]] = []
    attempts = {"n": 0}

    def work(identity: str) -> LeaderWork:
        async def count(fence: Fence) -> None:
            while True:
                ran.append((identity, fence.term))
                await asyncio.sleep(0.02)

        async def flaky(fence: Fence) -> None:
            attempts["n"] += 1
            if attempts["n"] == 1:
                raise RuntimeError("first run fails")
            await asyncio.Event().wait()

        return LeaderWork(
            FileStore(tmp_path), election="loops", identity=identity, ttl=2.0,
            tasks=[("count", count), ("flaky", flaky)],
        )  # fmt: skip

    a, b = work("a"), work("b")
    await a.start()
    await _until(lambda: a.status.leading)
    await b.start()
    await _until(lambda: attempts["n"] >= 2)
    assert a.status.task_failures == {"flaky": "RuntimeError: first run fails"}
    assert not b.status.leading and b.fence is None and a.fence is not None
    assert {who for who, _ in ran} == {"a"}
    await a.stop()
    await _until(lambda: b.status.leading)
    assert {who for who, _ in ran} == {"a", "b"}
    assert max(t for who, t in ran if who == "a") < min(t for who, t in ran if who == "b")
    await b.stop()


async def test_a_fenced_write_ends_the_leadership(tmp_path: Path) -> None:
    async def deposed(fence: Fence) -> None:
        raise FencedError("another replica leads")

    work = LeaderWork(
        FileStore(tmp_path), election="loops", identity="a", ttl=2.0, tasks=[("x", deposed)]
    )
    await work.start()
    await _until(lambda: work.status.last_loss.startswith("a write was fenced off"))
    await work.stop()
