"""The simulated service for bench/autoscale_sim.py: replicas with the heavy model's measured
cost, a shared queue, start-up time, drain, and the metric samples a controller would scrape.

Per replica (the heavy model, HTTP binary, adaptive batching; BENCHMARKS.md, issue 3):

* batch cost ``t(b) = 8.85 ms + 1.15 ms * b``, the backend's own affine cost model
  (``inferway/backends/batching/cost_model.py``) fitted to two measured points: 10.3 ms at one
  request in flight (less ~0.3 ms of HTTP) and the 870 rows/s closed-loop ceiling (1/870 s a row);
* batches up to 64 rows, so a replica serves at most ``64 / t(64)`` = 776 req/s;
* the adaptive batcher dispatches whenever the runner is idle, so at a steady rate ``l`` a
  batch holds ``b = l * a / (1 - l * c)`` rows, and p99 = ``K * t(b)`` plus the queue's wait;
  K = 3.37 is calibrated so that p99 reaches the 100 ms SLO at 610 req/s, the rate one replica
  sustained at p99 <= 100 ms in BENCHMARKS.md.

The flow is fluid at 1 s resolution: each second's Poisson arrivals are spread evenly over
the ready replicas (Envoy's least-request balancing), work beyond their capacity waits in one
queue (optimistic: a real queue sits at one replica), and a queue over 2 s of the ready
replicas' work is shed (the backend's max queue). Replicas cost from the moment they are
started until they are stopped; a removed replica leaves rotation at once and is billed for
a drain grace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferway.controllers.autoscale.samples import MetricSample

__all__ = ["Cluster", "ReplicaModel", "SecondStats"]


@dataclass(frozen=True)
class ReplicaModel:
    batch_a_s: float = 0.00885
    batch_c_s: float = 0.00115
    max_batch: int = 64
    p99_factor: float = 3.37
    slo_s: float = 0.100
    startup_s: float = 60.0
    drain_s: float = 10.0
    max_queue_s: float = 2.0

    @property
    def max_rate(self) -> float:
        """Rows per second one replica serves at full batches."""
        return self.max_batch / (self.batch_a_s + self.batch_c_s * self.max_batch)

    def batch_rows(self, rate: float) -> float:
        if rate * self.batch_c_s >= 1.0:
            return float(self.max_batch)
        return min(
            float(self.max_batch), max(1.0, rate * self.batch_a_s / (1 - rate * self.batch_c_s))
        )

    def batch_time(self, rows: float) -> float:
        return self.batch_a_s + self.batch_c_s * rows

    def sustained_rate(self) -> float:
        """The per-replica rate whose p99 equals the SLO (bisection on the model)."""
        lo, hi = 1.0, self.max_rate
        for _ in range(60):
            mid = (lo + hi) / 2
            if self.p99_factor * self.batch_time(self.batch_rows(mid)) > self.slo_s:
                hi = mid
            else:
                lo = mid
        return lo


@dataclass
class SecondStats:
    p99_s: float
    violated: bool
    shed: float


class Cluster:
    """Replicas of one service: ready, starting (ready at a time), draining (billed until)."""

    def __init__(self, model: ReplicaModel, replicas: int) -> None:
        self.model = model
        self.ready = replicas
        self.starting: list[float] = []
        self.draining: list[float] = []
        self.queue = 0.0
        self.replica_seconds = 0.0
        self.actions = 0
        self.reversals = 0
        self._last_direction = 0

    @property
    def current(self) -> int:
        return self.ready + len(self.starting)

    def scale_to(self, now: float, desired: int) -> None:
        delta = desired - self.current
        if delta == 0:
            return
        direction = 1 if delta > 0 else -1
        self.actions += 1
        if self._last_direction and direction != self._last_direction:
            self.reversals += 1
        self._last_direction = direction
        if delta > 0:
            self.starting.extend([now + self.model.startup_s] * delta)
            return
        remove = -delta
        while remove and self.starting:  # the newest never-ready replicas go first
            self.starting.pop()
            remove -= 1
        remove = min(remove, self.ready)
        self.ready -= remove
        self.draining.extend([now + self.model.drain_s] * remove)

    def step(self, now: float, arrivals: float) -> SecondStats:
        """Advance one second from ``now``: start-ups finish, ``arrivals`` are served."""
        m = self.model
        if self.starting and self.starting[0] <= now:
            done = [t for t in self.starting if t <= now]
            self.starting = [t for t in self.starting if t > now]
            self.ready += len(done)
        self.draining = [t for t in self.draining if t > now]
        self.replica_seconds += self.ready + len(self.starting) + len(self.draining)
        n = self.ready
        if n == 0:
            self.queue += arrivals
            return SecondStats(math.inf, True, 0.0)
        capacity = n * m.max_rate
        per_replica = min(arrivals / n, m.max_rate)
        self.queue = max(0.0, self.queue + arrivals - capacity)
        shed = max(0.0, self.queue - capacity * m.max_queue_s)
        self.queue -= shed
        p99 = m.p99_factor * m.batch_time(m.batch_rows(per_replica)) + self.queue / capacity
        return SecondStats(p99, p99 > m.slo_s or shed > 0, shed)

    def sample(self, now: float, rate: float, p99_s: float) -> MetricSample:
        """What a scrape would read: totals over ready replicas (rate over the last interval)."""
        m = self.model
        n = max(self.ready, 1)
        per_replica = min(rate / n, m.max_rate)
        mean_latency = 1.5 * m.batch_time(m.batch_rows(per_replica))
        return MetricSample(
            time=now,
            queue_length=self.queue,
            in_flight=rate * mean_latency + self.queue,
            request_rate=rate,
            p99_latency=p99_s,
            utilization=min(1.0, rate / (n * m.max_rate)),
        )
