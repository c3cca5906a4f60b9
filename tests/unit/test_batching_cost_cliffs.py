"""Adaptive batching past a cost cliff (``avoid_cost_cliffs``): the cost model offers a smaller
measured size that computes a row for less, and the scheduler cuts the batch to it.

CPU kernels have such cliffs (on one host the heavy benchmark model ran 32 rows in 28.8 ms and
64 in 71.8 ms); the last test drives the scheduler through a simulation on such a step.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest

from inferway.backends.batching import (
    TRUSTED,
    BatchingConfig,
    CostModel,
    Dispatch,
    Pending,
    Scheduler,
    WaitUntil,
)


def cliff(rows: int) -> float:
    """28.8 ms at 32 rows, 1.12 ms a row past 32 (71.8 ms at 64): a kernel's step."""
    if rows <= 32:
        return 0.006 + 0.0007125 * rows
    return 0.0718 * rows / 64


def smooth(rows: int) -> float:
    return 0.006 + 0.0007 * rows


def fed(cost, sizes=(1, 2, 4, 8, 16, 24, 32, 40, 48, 64), times: int = TRUSTED) -> CostModel:
    model = CostModel()
    for _ in range(times):
        for b in sizes:
            model.observe(b, cost(b))
    return model


def queued(s: Scheduler, n: int, at: float = 0.0) -> None:
    for i in range(n):
        s.submit(Pending(i, 1, 4, "a", at), at)


def rows_of(action) -> int:
    assert isinstance(action, Dispatch), action
    return action.rows


CONFIG = BatchingConfig(mode="adaptive", max_batch_size=64, max_queue_delay_s=0.04)


# -- the cost model -------------------------------------------------------------------------


def test_a_smooth_curve_offers_no_cheaper_size():
    model = fed(smooth)
    assert all(model.cheaper_size(b, 1.15) is None for b in range(1, 65))


def test_past_a_cliff_the_cheapest_smaller_size_is_offered():
    model = fed(cliff)
    assert model.cheaper_size(64, 1.15) == 32
    assert model.cheaper_size(48, 1.15) == 32
    assert model.cheaper_size(32, 1.15) is None  # the cheapest itself
    assert model.cheaper_size(16, 1.15) is None  # below the cliff, bigger is cheaper


def test_the_margin_is_respected():
    model = fed(cliff)
    # 40 rows: 1.122 ms a row against 32's 0.9: 24.7% more
    assert model.cheaper_size(40, 1.15) == 32
    assert model.cheaper_size(40, 1.3) is None


def test_a_size_seen_fewer_than_trusted_times_is_not_offered():
    model = fed(lambda b: 0.1 if b == 64 else cliff(b), sizes=(16, 64))
    model.observe(32, 0.0288 / 2)  # one lucky timing of 32 rows
    assert model.cheaper_size(64, 1.15) == 16  # not 32: seen once
    for _ in range(TRUSTED - 1):
        model.observe(32, 0.0288 / 2)
    assert model.cheaper_size(64, 1.15) == 32


def test_a_size_past_the_cliff_is_cut_only_once_timed_trusted_times():
    model = fed(cliff, sizes=(8, 16, 32))
    assert model.cheaper_size(48, 1.15) is None  # never timed: run it, and learn
    for seen in range(1, TRUSTED + 1):
        model.observe(48, cliff(48))
        assert model.cheaper_size(48, 1.15) == (32 if seen >= TRUSTED else None)


# -- the scheduler ----------------------------------------------------------------------------


def test_a_batch_past_the_cliff_is_cut_to_the_cheaper_size():
    s = Scheduler(CONFIG, fed(cliff))
    queued(s, 64)
    first = s.next_action(0.0, 1)
    assert rows_of(first) == 32
    assert [r.id for r in first.requests] == list(range(32))  # FIFO: the oldest go first
    assert s.cliff_cuts == 1
    assert rows_of(s.next_action(0.0, 1)) == 32
    assert s.queued == 0


def test_without_avoid_cost_cliffs_the_batch_runs_whole():
    s = Scheduler(CONFIG.model_copy(update={"avoid_cost_cliffs": False}), fed(cliff))
    queued(s, 64)
    assert rows_of(s.next_action(0.0, 1)) == 64
    assert s.cliff_cuts == 0


def test_a_smooth_curve_is_never_cut():
    s = Scheduler(CONFIG, fed(smooth))
    queued(s, 64)
    assert rows_of(s.next_action(0.0, 1)) == 64
    assert s.cliff_cuts == 0


@pytest.mark.parametrize("mode", ["fixed", "off"])
def test_only_adaptive_cuts(mode):
    s = Scheduler(CONFIG.model_copy(update={"mode": mode}), fed(cliff))
    queued(s, 64)
    assert rows_of(s.next_action(0.0, 1)) == (64 if mode == "fixed" else 1)
    assert s.cliff_cuts == 0


def test_a_shutdown_flush_is_not_cut():
    s = Scheduler(CONFIG, fed(cliff))
    queued(s, 64)
    assert rows_of(s.next_action(0.0, 1, flush=True)) == 64


def test_a_request_bigger_than_the_cheaper_size_runs_whole():
    s = Scheduler(CONFIG, fed(cliff))
    s.submit(Pending("big", 48, 4, "a", 0.0), 0.0)
    s.submit(Pending("next", 8, 4, "a", 0.0), 0.0)
    assert rows_of(s.next_action(0.0, 1)) == 56  # 48 rows cannot be split
    assert s.cliff_cuts == 0


def test_one_batch_in_probe_every_runs_whole_so_the_cliff_is_measured_again():
    from inferway.backends.batching import scheduler

    s = Scheduler(CONFIG, fed(cliff))
    whole = 0
    for round_ in range(scheduler._PROBE_EVERY * 2):
        queued(s, 48, at=float(round_))
        action = s.next_action(float(round_), 1)
        while s.queued:  # drain what the cut left
            s.next_action(float(round_), 1)
        if rows_of(action) == 48:
            whole += 1
    assert whole == 2
    assert s.cliff_cuts == scheduler._PROBE_EVERY * 2 - 2


def test_a_cliff_that_went_away_is_forgotten():
    model = fed(cliff)
    s = Scheduler(CONFIG, model)
    for _ in range(60):  # the probes now find 48 rows cheap
        model.observe(48, smooth(48))
    queued(s, 48)
    assert rows_of(s.next_action(0.0, 1)) == 48


# -- a simulation on the cliff -------------------------------------------------------------


def _simulate(
    rate: float, config: BatchingConfig, n: int = 6000, seed: int = 3, cost=cliff
) -> float:
    """p99 latency of Poisson arrivals at ``rate`` on one instance costing ``cost(b)``."""
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    s: Scheduler[Pending] = Scheduler(config)
    latencies: list[float] = []
    running: list[tuple[float, int, Dispatch[Pending]]] = []
    idle, wake, seq, i = 1, math.inf, 0, 0
    while i < n or running or s.queued:
        now = min(arrivals[i] if i < n else math.inf, running[0][0] if running else math.inf, wake)
        assert math.isfinite(now), "simulation stalled"
        while running and running[0][0] <= now:
            _, _, batch = heapq.heappop(running)
            idle += 1
            latencies.extend(now - r.arrival for r in batch.requests)
            s.on_dispatch_done(batch.rows, cost(batch.rows), now)
        while i < n and arrivals[i] <= now:
            s.submit(Pending(i, 1, 4, "a", arrivals[i]), now)
            i += 1
        wake = math.inf
        while True:
            action = s.next_action(now, idle)
            if isinstance(action, Dispatch):
                idle -= 1
                seq += 1
                heapq.heappush(running, (now + cost(action.rows), seq, action))
                continue
            if isinstance(action, WaitUntil):
                wake = action.at
            break
    assert len(latencies) == n
    kept = sorted(latencies[n // 10 :])
    return kept[int(0.99 * (len(kept) - 1))]


def test_on_a_cliff_the_rule_keeps_stable_a_rate_that_overloads_the_batcher_without_it():
    # 32-row batches serve 1,111 rows/s; the 33-64-row batches a queue forms at 1,000 rows/s
    # serve 891: without the rule the queue grows for as long as the load lasts
    with_rule = _simulate(1_000.0, CONFIG)
    without = _simulate(1_000.0, CONFIG.model_copy(update={"avoid_cost_cliffs": False}))
    assert with_rule < 0.2, with_rule
    assert without > 3 * with_rule, (without, with_rule)


def test_on_a_smooth_curve_the_rule_changes_nothing():
    def run(config: BatchingConfig) -> float:
        return _simulate(1_000.0, config, cost=smooth)

    assert run(CONFIG) == run(CONFIG.model_copy(update={"avoid_cost_cliffs": False}))
