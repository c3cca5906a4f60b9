"""Weighted canary splits through the real Envoy match the policy's weights."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import Gateway, binomial_bounds

pytestmark = pytest.mark.integration


async def test_a_90_10_policy_sends_10_percent_to_the_canary(gateway: Gateway) -> None:
    n = 2000
    counts = await gateway.send(n)
    assert counts["v1"] + counts["v2"] == n, counts
    low, high = binomial_bounds(n, 0.10)
    assert low <= counts["v2"] <= high, counts


async def test_a_0_1_percent_canary_gets_its_share_and_no_more(gateway: Gateway) -> None:
    await gateway.edit({"v1": 99.9, "v2": 0.1})
    n = 20_000
    started = time.monotonic()
    counts = await gateway.send(n)
    elapsed = time.monotonic() - started
    assert counts["v1"] + counts["v2"] == n, counts
    low, high = binomial_bounds(n, 0.001)
    assert counts["v2"] >= 1, counts
    assert low <= counts["v2"] <= high, counts
    assert elapsed < 60, f"{n} requests took {elapsed:.1f}s"
