"""Adaptive batching in a discrete-event simulation: fake clock, fake cost t(b) = 2ms + 0.1ms*b.

The scheduler is driven exactly as the executor drives it (expire, then next_action until it
stops dispatching), so its latency and batch-size behaviour can be checked without threads.
"""

from __future__ import annotations

import heapq
import math
import random

from inferway.backends.batching import BatchingConfig, Pending, Scheduler
from tests.batching_sim import Running, start_batches

SLO = 0.02


def cost(rows: int) -> float:
    return 0.002 + 0.0001 * rows


def simulate(arrival_times: list[float], *, instances: int = 1, closed_loop: bool = False):
    """Returns (latencies, batch sizes). closed_loop: one client, next request on response."""
    cfg = BatchingConfig(
        mode="adaptive",
        max_batch_size=64,
        max_queue_delay_s=0.01,
        latency_slo_s=SLO,
        max_queue_size=100_000,
        instances=instances,
    )
    s = Scheduler(cfg)
    pending_arrivals = list(arrival_times)
    heapq.heapify(pending_arrivals)
    running: Running = []
    idle, wake = instances, math.inf
    latencies: list[float] = []
    sizes: list[int] = []
    next_id = 0
    while pending_arrivals or running or s.queued:
        t_arr = pending_arrivals[0] if pending_arrivals else math.inf
        t_done = running[0][0] if running else math.inf
        now = min(t_arr, t_done, wake)
        assert math.isfinite(now), "simulation stalled"
        while running and running[0][0] <= now:
            _, _, batch = heapq.heappop(running)
            idle += 1
            latencies.extend(now - r.arrival for r in batch.requests)
            s.on_dispatch_done(batch.rows, cost(batch.rows), now)
            if closed_loop:
                heapq.heappush(pending_arrivals, now + 0.0002)  # client think/RTT time
        while pending_arrivals and pending_arrivals[0] <= now:
            heapq.heappop(pending_arrivals)
            s.submit(Pending(next_id, 1, 4, "x", now), now)
            next_id += 1
        assert s.expire(now) == []
        started, wake = start_batches(s, now, idle, running, cost)
        idle -= len(started)
        sizes.extend(b.rows for b in started)
        if closed_loop and next_id >= len(arrival_times) + 200 and not running:
            pending_arrivals.clear()
    return latencies, sizes


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def test_adaptive_meets_the_slo_and_batches_grow_with_load():
    mean_sizes = []
    for rate in (100.0, 1_000.0, 3_000.0, 6_000.0):
        latencies, sizes = simulate(poisson(rate, 3_000, seed=int(rate)))
        assert len(latencies) == 3_000
        assert p99(latencies) < SLO, (rate, p99(latencies))
        mean_sizes.append(sum(sizes) / len(sizes))
    assert mean_sizes == sorted(mean_sizes), mean_sizes
    assert mean_sizes[0] < 1.2 and mean_sizes[-1] > 8, mean_sizes


def test_one_request_in_flight_pays_no_batching_latency():
    latencies, sizes = simulate([0.0], closed_loop=True)
    assert set(sizes) == {1}
    assert max(latencies) <= cost(1) + 1e-9


def test_several_instances_share_the_load_within_the_slo():
    latencies, sizes = simulate(poisson(8_000.0, 3_000, seed=7), instances=2)
    assert p99(latencies) < SLO
    assert sum(sizes) == 3_000
