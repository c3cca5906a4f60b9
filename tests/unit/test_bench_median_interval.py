"""bench/_common.py's median_interval: the 95% interval the benchmarks quote for a median
over rounds (rounds resampled)."""

from __future__ import annotations

import statistics

from bench._common import MIN_ROUNDS_FOR_INTERVAL, median_interval


def test_too_few_rounds_or_no_spread_give_no_interval() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0][: MIN_ROUNDS_FOR_INTERVAL - 1]) is None
    assert median_interval([2.5, 1.0, 3.0, 2.0]) is None
    assert median_interval([2.0] * 12) is None


def test_the_interval_holds_the_median_within_the_rounds_range() -> None:
    rounds = [2.1, 2.5, 1.9, 3.0, 2.4, 2.2, 2.8, 1.7, 2.6, 2.3, 2.0, 2.9]
    interval = median_interval(rounds)
    assert interval is not None
    low, high = interval
    assert min(rounds) <= low < statistics.median(rounds) < high <= max(rounds)
    assert median_interval(rounds) == interval  # a fixed seed: the same table each time


def test_a_wider_spread_gives_a_wider_interval() -> None:
    tight = [2.0 + 0.01 * i for i in range(12)]
    wide = [2.0 + 0.3 * i for i in range(12)]
    tight_interval, wide_interval = median_interval(tight), median_interval(wide)
    assert tight_interval is not None and wide_interval is not None
    assert wide_interval[1] - wide_interval[0] > 10 * (tight_interval[1] - tight_interval[0])
