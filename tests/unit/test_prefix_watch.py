"""The fleet's prefix watch (evidence, autoscale state, rate-limit splits): it takes every
record under its prefix, and a record its handler fails on is logged and passed over while the
watch goes on (before, an unexpected exception ended the task silently and the mirror
stopped)."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferway.gateway.fleet.prefix_watch import PrefixWatch
from inferway.gateway.fleet.store import Record
from tests.helpers import poll_until
from tests.memory_store import MemoryStore


async def test_a_failing_record_is_logged_and_the_watch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(time.monotonic)
    await store.put("p/a", b"1")
    taken: list[str] = []
    seen = [0]

    def take(record: Record) -> None:
        seen[0] = max(seen[0], record.version)
        if record.value == b"bad":
            raise ValueError("unreadable record")
        taken.append(record.key)

    watch = PrefixWatch(store, "p/", take, lambda: seen[0], "test watch")
    watch.start()
    try:
        await poll_until(lambda: taken == ["p/a"], timeout=5, what="the listed record")
        await store.put("p/b", b"bad")
        await store.put("q/x", b"1")  # another prefix: not taken
        await poll_until(
            lambda: "test watch: record p/b (version 2) not taken" in caplog.text,
            timeout=5,
            what="the log",
        )
        await store.put("p/c", b"1")
        await poll_until(lambda: "p/c" in taken, timeout=5, what="a record after the failure")
        assert "q/x" not in taken
    finally:
        await watch.stop()
    await watch.stop()  # twice is fine
    await asyncio.sleep(0)
