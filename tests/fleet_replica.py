"""One control-plane replica's leader-only work, as its own process, for the election tests:
``python -m tests.fleet_replica STORE_URL IDENTITY TTL``. While it leads it makes numbered
decisions, each written once (``decisions/<n>``, must not exist) with its fence, every 50 ms.
A decision written twice or by a deposed leader would break the sequence the test reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

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
