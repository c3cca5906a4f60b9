"""One control-plane replica's leader-only work, as its own process, for the election tests:
``python -m tests.fleet_replica STORE_URL IDENTITY TTL``. While it leads it makes numbered
decisions, each written once (``decisions/<n>``, must not exist) with its fence, every 50 ms.
A decision written twice or by a deposed leader would break the sequence the test reads.
``kill_the_leader`` runs three of them and kills the first leader; ``assert_handed_over``
checks what they decided."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferway.gateway.fleet.election import LeaderWork
from inferway.gateway.fleet.store import ConflictError, Fence, Store
from inferway.gateway.fleet.store_url import open_store


async def _decide(store: Store, identity: str, fence: Fence) -> None:
    while True:
        existing = await store.list("decisions/")
        n = 1 + max((int(r.key.rsplit("/", 1)[1]) for r in existing), default=0)
        body = json.dumps({"n": n, "by": identity, "term": fence.term}).encode()
        with contextlib.suppress(ConflictError):  # someone wrote n: read again
            await store.put(f"decisions/{n:06d}", body, expect=0, fence=fence)
        await asyncio.sleep(0.05)


ROOT = Path(__file__).resolve().parents[1]


def spawn_replica(url: str, identity: str, ttl: float, log: Path) -> subprocess.Popen[bytes]:
    """This module as a replica process (stop it by its pid)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fleet_replica", url, identity, str(ttl)],
        cwd=ROOT,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@dataclass
class Handover:
    first: str
    """The first leader (killed)."""
    leader: str
    """The one that took over."""
    took: float
    """Seconds from the kill until the store named another leader."""
    decisions: list[dict[str, Any]]


async def kill_the_leader(store: Store, url: str, ttl: float, logs: Path) -> Handover:
    """Replicas r1-r3 on ``url``: the first leader decides for 1.5 s and is SIGKILLed, the next
    decides for 1.5 s; then every replica is stopped (by its pid) and the decisions read."""
    replicas = {
        name: spawn_replica(url, name, ttl, logs / f"{name}.log") for name in ("r1", "r2", "r3")
    }
    try:
        deadline = time.monotonic() + 30
        while (first := await store.leader("loops")) is None:
            assert time.monotonic() < deadline, "no replica was elected"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # decisions made by the first leader
        os.kill(replicas[first].pid, signal.SIGKILL)
        killed = time.monotonic()
        while (leader := await store.leader("loops")) in (None, first):
            assert time.monotonic() - killed < 3 * ttl, "nobody took over"
            await asyncio.sleep(0.02)
        took = time.monotonic() - killed
        await asyncio.sleep(1.5)  # decisions made by the second leader
    finally:
        for process in replicas.values():
            process.kill()
            process.wait(timeout=10)
    decisions = [json.loads(r.value) for r in await store.list("decisions/")]
    assert leader is not None
    return Handover(first, leader, took, decisions)


def assert_handed_over(handover: Handover, ttl: float) -> None:
    """Within ``ttl`` + 1 s, and the decisions one unbroken sequence, each made once, in two
    terms (one leader each, the killed one's first), terms never going back."""
    assert handover.took < ttl + 1.0, f"failover took {handover.took:.2f}s"
    decisions = handover.decisions
    numbers = [d["n"] for d in decisions]
    assert numbers == list(range(1, len(numbers) + 1)), "a decision was skipped or repeated"
    terms = [d["term"] for d in decisions]
    assert terms == sorted(terms), "a deposed leader decided after the new one"
    makers = {d["term"]: d["by"] for d in decisions}
    assert len({d["by"] for d in decisions if d["term"] == terms[0]}) == 1
    assert makers[terms[0]] == handover.first and makers[terms[-1]] == handover.leader
    assert len(set(terms)) == 2 and len(decisions) > 20


async def main(url: str, identity: str, ttl: float) -> None:
    store = open_store(url, workdir=Path("."))
    work = LeaderWork(
        store,
        election="loops",
        identity=identity,
        ttl=ttl,
        tasks=[("decide", lambda fence: _decide(store, identity, fence))],
    )
    await work.start()
    print("started", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
