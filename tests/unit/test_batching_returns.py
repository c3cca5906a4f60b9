"""The adaptive scheduler's wait_for_returns rule: closed-loop clients of answered batches come
back within a return gap, and the batch is held for them, never with one client and never past
the latency limits (fake clock, a discrete-event simulation of closed-loop clients)."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferway.backends.batching import BatchingConfig, CostModel, Dispatch, Pending, Scheduler
from inferway.backends.batching.records import WaitUntil
from inferway.backends.batching.returns import HORIZON_GAPS, ReturnWatch
from tests.batching_sim import Running, start_batches

MAX_DELAY = 0.005
SLO = 0.01


def cost(rows: int) -> float:
    """A tiny model: a batch's fixed cost dwarfs a row's, so a lone request is worth holding
    only for the batch's sake, never for the instance's time."""
    return 0.0002 + 0.00001 * rows


# -- ReturnWatch ------------------------------------------------------------------------------


def test_returns_are_matched_to_the_latest_answer_still_owed():
    watch = ReturnWatch(alpha=1.0)
    watch.answered(3, 1.0)
    watch.answered(1, 1.001)
    assert watch.owed(1.001) == 4
    assert watch.gap is None and watch.expected_back(1.001) is None  # no return seen yet
    watch.arrived(1.003)  # taken as the second answer's one client
    assert watch.owed(1.003) == 3
    assert watch.gap == pytest.approx(0.002)
    # the clients of the latest answer still owed (the first) are expected a high gap after it
    high = watch.high_gap()
    assert high is not None
    assert watch.expected_back(1.003) == pytest.approx(1.0 + high)
    watch.arrived(1.004)
    assert watch.owed(1.004) == 2 and watch.gap == pytest.approx(0.004)


def test_clients_that_never_come_back_stop_being_owed():
    watch = ReturnWatch(alpha=1.0)
    watch.answered(1, 0.0)
    watch.arrived(0.001)  # learns a 1 ms gap
    watch.answered(10, 0.010)
    assert watch.owed(0.011) == 10
    high = watch.high_gap()
    assert high is not None
    assert watch.owed(0.010 + HORIZON_GAPS * high + 1e-6) == 0
    watch.arrived(0.5)  # a newcomer with nothing owed: no gap to learn
    assert watch.gap == pytest.approx(0.001)


def test_an_empty_answer_is_no_answer_and_alpha_is_checked():
    watch = ReturnWatch()
    watch.answered(0, 1.0)
    assert watch.owed(1.0) == 0
    with pytest.raises(ValueError, match="alpha"):
        ReturnWatch(alpha=0.0)


# -- the rule, step by step ---------------------------------------------------------------------


def learned() -> CostModel:
    model = CostModel()
    for b in (1, 2, 4, 8, 16, 32, 64):
        model.observe(b, cost(b))
    return model


def scheduler(*, hold: bool = True) -> Scheduler[Pending]:
    cfg = BatchingConfig(
        mode="adaptive",
        max_batch_size=64,
        max_queue_delay_s=MAX_DELAY,
        latency_slo_s=SLO,
        wait_for_returns=hold,
    )
    return Scheduler(cfg, learned())


def settle_a_batch_of(s: Scheduler[Pending], n: int, at: float, gap: float) -> None:
    """One request answered at ``at``, its client back ``gap`` later (so the return gap is
    learned), then a batch of ``n`` answered: ``n`` clients are owed."""
    s.on_dispatch_done(1, cost(1), at, requests=1)
    s.submit(Pending("warm", 1, 4, "a", at + gap), at + gap)
    assert isinstance(s.next_action(at + gap, 1), (Dispatch, WaitUntil))
    s.clear()
    s.on_dispatch_done(n, cost(n), at + 2 * gap, requests=n)


def test_a_request_back_early_waits_for_the_rest_of_its_batch():
    s = scheduler()
    settle_a_batch_of(s, 32, 0.0, 0.001)
    t = 0.0022
    s.submit(Pending(1, 1, 4, "a", t), t)
    action = s.next_action(t, 1)
    assert isinstance(action, WaitUntil)
    assert t < action.at <= t + MAX_DELAY
    assert s.held >= 1
    # the same without the rule: the idle instance takes the lone request at once
    off = scheduler(hold=False)
    settle_a_batch_of(off, 32, 0.0, 0.001)
    off.submit(Pending(1, 1, 4, "a", t), t)
    assert isinstance(off.next_action(t, 1), Dispatch)


def test_no_hold_once_most_clients_are_back():
    s = scheduler()
    settle_a_batch_of(s, 8, 0.0, 0.001)
    t = 0.0022
    for i in range(6):  # 6 of the 8 are back: 2 out is fewer than the rows queued
        s.submit(Pending(i, 1, 4, "a", t), t)
    assert isinstance(s.next_action(t, 1), Dispatch)


def test_the_hold_keeps_the_latency_limit():
    s = scheduler()
    settle_a_batch_of(s, 32, 0.0, 0.004)  # clients take 4 ms to come back
    t = 0.0081
    s.submit(Pending(1, 1, 4, "a", t, deadline=t + 0.001), t)
    action = s.next_action(t, 1)
    assert isinstance(action, WaitUntil)
    # the batch it waits for (this request and the 31 clients still out) still makes the
    # deadline with its compute time inflated as the adaptive rule inflates it
    assert action.at + 1.25 * cost(32) <= t + 0.001 + 1e-9
    assert action.at < 0.008 + 0.004  # earlier than the clients are expected back


# -- closed-loop simulation ----------------------------------------------------------------------


def simulate(
    clients: int,
    *,
    hold: bool,
    seed: int = 1,
    requests: int = 3000,
    s: Scheduler[Pending] | None = None,
    start: float = 0.0,
) -> tuple[list[float], list[int], list[float], int, float]:
    """``clients`` closed loops, each back 0.2-3 ms after its answer (spread, as thread clients
    under one GIL are); one instance. Returns latencies, batch sizes, each batch's oldest
    request's queue wait, how many holds the rule chose, and when it ended. With ``s`` (and
    a ``start`` on its clock) it goes on with that scheduler; the clients leave once
    ``requests`` are answered, with whatever they had in flight."""
    rng = random.Random(seed)
    if s is None:
        s = scheduler(hold=hold)
        s.cost_model = CostModel()
    held_before = s.held
    arrivals = [start + rng.uniform(0, 0.003) for _ in range(clients)]
    heapq.heapify(arrivals)
    running: Running = []
    idle, wake, sent = 1, math.inf, 0
    latencies: list[float] = []
    sizes: list[int] = []
    waits: list[float] = []
    while len(latencies) < requests:
        now = min(arrivals[0] if arrivals else math.inf, running[0][0] if running else math.inf)
        now = min(now, wake)
        assert math.isfinite(now), "simulation stalled"
        while running and running[0][0] <= now:
            _, _, batch = heapq.heappop(running)
            idle += 1
            latencies.extend(now - r.arrival for r in batch.requests)
            s.on_dispatch_done(batch.rows, cost(batch.rows), now, requests=len(batch.requests))
            for _ in batch.requests:
                heapq.heappush(arrivals, now + rng.uniform(0.0002, 0.003))
        while arrivals and arrivals[0] <= now:
            heapq.heappop(arrivals)
            s.submit(Pending((start, sent), 1, 4, "x", now), now)
            sent += 1
        started, wake = start_batches(s, now, idle, running, cost)
        idle -= len(started)
        sizes.extend(b.rows for b in started)
        waits.extend(now - b.requests[0].arrival for b in started)
    s.clear()
    return latencies, sizes, waits, s.held - held_before, now


def test_closed_loop_clients_fill_their_batches():
    _, sizes_off, _, _, _ = simulate(64, hold=False)
    latencies, sizes_on, waits, held, _ = simulate(64, hold=True)
    assert held > 0
    mean_off = sum(sizes_off) / len(sizes_off)
    mean_on = sum(sizes_on) / len(sizes_on)
    assert mean_on > 1.3 * mean_off, (mean_off, mean_on)
    assert sum(1 for b in sizes_on if b == 1) < 0.1 * len(sizes_on)
    assert max(waits) <= MAX_DELAY + 1e-9
    assert max(latencies) <= SLO + 1e-9


def test_one_client_left_of_many_stops_waiting_for_the_others_at_once():
    """Many clients, then all but one leave with requests in flight: the ones that left stop
    being owed within a few return gaps, and the one left is not held for them."""
    s = scheduler()
    s.cost_model = CostModel()
    _, _, _, held, end = simulate(16, hold=True, requests=1000, s=s)
    assert held > 0
    latencies, sizes, _, held, _ = simulate(1, hold=True, requests=300, s=s, start=end)
    assert held <= 3 and set(sizes) == {1}
    assert max(latencies[10:]) == pytest.approx(cost(1))


def test_one_client_never_waits():
    latencies, sizes, waits, held, _ = simulate(1, hold=True, requests=500)
    assert held == 0
    assert set(sizes) == {1}
    assert max(waits) == 0.0
    assert max(latencies) == pytest.approx(cost(1))


@settings(max_examples=40, deadline=None)
@given(clients=st.integers(1, 96), seed=st.integers(0, 10_000))
def test_holds_never_pass_the_queue_delay_or_the_slo(clients, seed):
    latencies, _, waits, held, _ = simulate(clients, hold=True, seed=seed, requests=400)
    assert max(waits) <= MAX_DELAY + 1e-9
    assert max(latencies) <= SLO + 1e-9
    if clients < 4:  # too few clients out to hold for
        assert held == 0
