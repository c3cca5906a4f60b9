"""Editing the policy file moves live traffic without dropping a request; a bad edit moves
nothing and says where it is wrong."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.e2e.conftest import Gateway, binomial_bounds, poll_until, write_atomically

pytestmark = pytest.mark.integration


@dataclass
class SteadyLoad:
    """Requests sent back to back by ``workers`` tasks until stopped; each outcome is kept with
    the moment its request started, so a test can split them at an edit."""

    gateway: Gateway
    workers: int = 16
    outcomes: list[tuple[float, str]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _worker(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, version = await self.gateway.request()
                outcome = version if version is not None else f"status {status}"
            except (aiohttp.ClientError, TimeoutError) as error:
                outcome = f"error {type(error).__name__}"
            self.outcomes.append((started, outcome))

    def started_after(self, moment: float) -> Counter[str]:
        return Counter(o for t, o in self.outcomes if t >= moment)

    def started_before(self, moment: float) -> Counter[str]:
        return Counter(o for t, o in self.outcomes if t < moment)

    async def wait_for(self, count: int, *, after: float, timeout: float = 30.0) -> None:
        await poll_until(
            lambda: sum(1 for t, _ in self.outcomes if t >= after) >= count,
            timeout=timeout,
            what=f"{count} requests after the edit",
        )


def _position_of_value(text: str, value: str) -> tuple[int, int]:
    """1-based line and column of the first line of ``text`` that ends with ``: value``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.endswith(f": {value}"):
            return number, len(line) - len(value) + 1
    raise AssertionError(f"no line ends with ': {value}' in the policy text")


async def test_editing_weights_under_load_moves_traffic_with_zero_failed_requests(
    gateway: Gateway,
) -> None:
    load = SteadyLoad(gateway)
    load.start()
    try:
        await load.wait_for(1000, after=0.0)
        editing = time.monotonic()
        await gateway.edit({"v1": 50.0, "v2": 50.0})
        applied = time.monotonic()
        await load.wait_for(2000, after=applied)
    finally:
        await load.stop()

    everything = Counter(o for _, o in load.outcomes)
    failures = {k: v for k, v in everything.items() if k not in ("v1", "v2")}
    assert not failures, f"failed during the edit: {failures} of {everything.total()}"

    # Envoy routes by the new weights from some moment before it ACKs, and the ACK is seen
    # later still: requests started while the edit was in flight belong to neither side
    before = load.started_before(editing)
    after = load.started_after(applied)
    n_before, n_after = before.total(), after.total()
    low, high = binomial_bounds(n_before, 0.10)
    assert n_before >= 1000 and low <= before["v2"] <= high, before
    low, high = binomial_bounds(n_after, 0.50)
    assert n_after >= 2000 and low <= after["v2"] <= high, after


@pytest.mark.parametrize(
    ("weights", "needle", "field_path"),
    [
        ({"v1": 90.0, "v2": "0.05"}, "0.05", "routes[0].backends[1].weight"),
        ({"v1": 90.0, "v3": 10.0}, "v3", "routes[0].backends[1].service"),
    ],
    ids=["weight-below-resolution", "unknown-service"],
)
async def test_an_invalid_edit_changes_nothing_and_is_reported_with_its_location(
    gateway: Gateway, weights: dict[str, float | str], needle: str, field_path: str
) -> None:
    cp = gateway.cp
    version_before = cp.version
    acked_before = cp.acked()
    envoy_route_before = await gateway.envoy_route_version()
    assert envoy_route_before is not None
    assert cp.control_plane.last_refused is None

    text = gateway.policy_text(weights)
    write_atomically(cp.policy_path, text)
    await poll_until(
        lambda: cp.control_plane.last_refused is not None,
        timeout=10,
        what="the watcher to refuse the edit",
    )

    refusal = cp.control_plane.last_refused
    assert refusal is not None
    line, column = _position_of_value(text, needle)
    issue = refusal.issues[0]
    assert (issue.file, issue.line, issue.column, issue.path) == (
        str(cp.policy_path),
        line,
        column,
        field_path,
    ), refusal.lines()
    assert refusal.lines()[0].startswith(f"{cp.policy_path}:{line}:{column}: {field_path}: ")

    assert cp.version == version_before
    snapshot = cp.cache.get_snapshot()
    assert snapshot is not None and snapshot.version == version_before
    assert cp.acked() == acked_before
    assert await gateway.envoy_route_version() == envoy_route_before

    n = 2000
    counts = await gateway.send(n)
    low, high = binomial_bounds(n, 0.10)
    assert counts["v1"] + counts["v2"] == n and low <= counts["v2"] <= high, counts

    # The refusal does not wedge the watcher: the next good edit goes live.
    await gateway.edit({"v1": 0.0, "v2": 100.0})
    assert await gateway.send(200) == Counter({"v2": 200})
