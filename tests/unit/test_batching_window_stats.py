"""WindowStats (the executor's O(1) rps / utilization) against a brute-force walk."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.backends.batching.window_stats import WindowStats

WINDOW = 10.0


def _brute(
    batches: list[tuple[int, float, float, int]],
    running: dict[int, float],
    now: float,
    started: float,
    instances: int,
) -> tuple[float, float]:
    """What the executor used to compute: walk every recorded batch."""
    start = now - WINDOW
    span = min(WINDOW, now - started)
    done = sum(n for _, _, e, n in batches if e >= start)
    busy = sum(e - max(s, start) for _, s, e, _ in batches if e > start)
    busy += sum(now - max(s, start) for s in running.values())
    if span <= 0:
        return 0.0, 1.0 if running else 0.0
    return done / span, min(max(busy / (span * instances), 0.0), 1.0)


# one step: (instance, gap before it begins, batch duration, requests, query after it?)
_steps = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.floats(0, 4, allow_nan=False),
        st.floats(0, 3, allow_nan=False),
        st.integers(1, 64),
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(instances=st.integers(1, 3), steps=_steps, gaps=st.lists(st.floats(0, 30), max_size=5))
def test_matches_brute_force_walk(instances: int, steps: list, gaps: list[float]) -> None:
    stats = WindowStats(instances, WINDOW, 0.0)
    free_at = [0.0] * instances  # per instance, batches never overlap
    events: list[tuple[float, str, int, int]] = []
    now = 0.0
    for inst, gap, dur, reqs, _ in steps:
        inst %= instances
        begin = max(now, free_at[inst]) + gap
        free_at[inst] = begin + dur
        events.append((begin, "begin", inst, reqs))
        events.append((begin + dur, "end", inst, reqs))
        now = begin
    events.sort(key=lambda e: e[0])  # stable: per instance, in the order they happen
    recorded: list[tuple[int, float, float, int]] = []
    running: dict[int, float] = {}
    for t, kind, inst, reqs in events:
        if kind == "begin":
            stats.begin(inst, t)
            running[inst] = t
        else:
            stats.end(inst, reqs, t)
            recorded.append((inst, running.pop(inst), t, reqs))
        want_rps, want_util = _brute(recorded, running, t, 0.0, instances)
        assert stats.rps(t) == pytest.approx(want_rps, rel=1e-9, abs=1e-9)
        assert stats.utilization(t) == pytest.approx(want_util, rel=1e-9, abs=1e-9)
        assert stats.running == len(running)
    t = events[-1][0] if events else 0.0
    for gap in gaps:  # queries long after the last batch: the window empties out
        t += gap
        want_rps, want_util = _brute(recorded, running, t, 0.0, instances)
        assert stats.rps(t) == pytest.approx(want_rps, rel=1e-9, abs=1e-9)
        assert stats.utilization(t) == pytest.approx(want_util, rel=1e-9, abs=1e-9)


def test_straddling_batch_counts_only_its_part_inside_the_window() -> None:
    stats = WindowStats(1, WINDOW, 0.0)
    stats.begin(0, 5.0)
    stats.end(0, 4, 15.0)  # busy 5..15
    # at 20 the window is 10..20: 5 s of the batch lie inside it
    assert stats.utilization(20.0) == pytest.approx(0.5)
    assert stats.rps(20.0) == pytest.approx(0.4)
    assert stats.rps(25.1) == 0.0 and stats.utilization(25.1) == 0.0


def test_running_batch_counts_as_busy_and_span_starts_at_restart() -> None:
    stats = WindowStats(2, WINDOW, 0.0)
    stats.restart(100.0)
    assert stats.utilization(100.0) == 0.0 and stats.rps(100.0) == 0.0
    stats.begin(1, 100.0)
    assert stats.utilization(100.0) == 1.0  # no time has passed yet, but one is busy
    assert stats.utilization(102.0) == pytest.approx(0.5)  # one of two instances, 2 s of 2 s


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="instances"):
        WindowStats(0, WINDOW, 0.0)
    with pytest.raises(ValueError, match="window_s"):
        WindowStats(1, 0.0, 0.0)
