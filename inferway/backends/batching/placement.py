"""Where a batch computes (``BatchingConfig.compute_thread``): the model instance's worker
thread, which leaves the event loop free to read and answer meanwhile, or the event loop's own
thread, which saves the two thread switches of the hand-over.

``auto`` computes on the loop a batch expected (from the learned costs) to take under
``INLINE_BELOW_S``. While the process may use one CPU at most (``cpu_allowance``) it also
computes there a CPU model's batch expected to take ``ONE_CPU_INLINE_S``, and a shorter one
expected to end before the next request to the loop (the quiet rule): on one CPU the worker
only takes turns with the loop, which pays for the hand-over only when the loop has requests to
read meanwhile. The next request is expected at the rate of the model's own requests, from
their mean gap, plus the other models' on the same loop (``shared_loop.py``). The model's own
mean gap, not its silence so far: under many closed-loop clients a silence means they all wait
for answers, and they come back as soon as they have them; another model's rate falls with its
silence, so one whose traffic stopped stops counting. Either goes on the loop only if it ends
before the earliest deadline of a request still queued for any model on the loop (the loop is
what answers that request's timeout). Every other batch goes to the worker.

The quiet rule also keeps the cost model honest: on one core a worker's batch measures slower
than the same batch on the loop (the tiny MLP's one-row batch, thread CPU time: 208-244 against
133-148 µs, the worker sharing its core and caches with the loop's reading and answering), so a
quick batch that once went to the worker, judged by ``INLINE_BELOW_S`` alone, could be kept
there by its own inflated measurements (docs/serving-performance.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from ..runners.base import Runner
from .cost_model import CostModel
from .cpu_allowance import CpuAllowance
from .shared_loop import DeadlineSource, ExpectedWait, LoopMember, SharedLoop

ArrivalGap = Callable[[], float | None]
"""The mean seconds between the model's requests so far (``ArrivalRate.mean_gap``); None
before its second request."""

__all__ = ["CPU_PROVIDERS", "INLINE_BELOW_S", "ONE_CPU_INLINE_S", "BatchPlacement"]

INLINE_BELOW_S = 0.0002
"""A batch the cost model expects to finish faster than this runs on the event loop thread:
handing it to a worker thread and back costs about as much as computing it."""
ONE_CPU_INLINE_S = (0.005, 0.05)
"""While the process may use one CPU at most, a CPU model's batch expected to take this long
(from, up to) runs on the event loop thread (``compute_thread: auto``). On one core a batch on
the worker is preempted by the loop for every request that arrives meanwhile: the heavy
model's batches (7-44 ms) sustained as much or up to 17% more on the loop, while the tiny
model's (0.1-2 ms) did no better there than on the worker (docs/backend.md). A longer batch
still goes to the worker, so that health checks and other models' requests are not held up
behind it."""
CPU_PROVIDERS = frozenset({"CPUExecutionProvider"})
"""Runner providers whose ``run`` keeps a CPU busy throughout (a GPU runner mostly waits)."""


class BatchPlacement:
    """The ``compute_thread`` rule for one model's batches.

    ``next_deadline``: the earliest deadline of a request still queued for the model (None:
    none has one), on the clock of ``on_loop``'s ``now``. ``arrival_gap``: the mean seconds
    between the model's requests (default: none, so no batch counts as quiet);
    ``expected_wait``: when the model's next request is expected, which the other models on
    the loop ask. ``shared_loop``: the models served on the same event loop, which this one
    joins (None: this model alone). They are asked only on one CPU. ``cpu_allowance`` None: the
    process's CPUs are not asked (tests place batches deterministically); it is asked only
    where every runner computes on the CPU."""

    def __init__(
        self,
        compute_thread: Literal["auto", "worker", "loop"],
        runners: Sequence[Runner],
        cost_model: CostModel,
        *,
        next_deadline: DeadlineSource = lambda: None,
        arrival_gap: ArrivalGap = lambda: 0.0,
        expected_wait: ExpectedWait = lambda now: math.inf,
        shared_loop: SharedLoop | None = None,
        inline_below_s: float = INLINE_BELOW_S,
        cpu_allowance: CpuAllowance | None = None,
    ) -> None:
        self._where = compute_thread
        self._arrival_gap = arrival_gap
        self._member = LoopMember(next_deadline, expected_wait)
        self._loop = SharedLoop() if shared_loop is None else shared_loop
        self._loop.join(self._member)
        self._cost = cost_model
        self._inline_below_s = inline_below_s
        on_cpu = all(getattr(r, "provider", None) in CPU_PROVIDERS for r in runners)
        self._one_cpu = cpu_allowance if on_cpu else None

    def on_loop(self, rows: int, now: float) -> bool:
        """Whether a batch of ``rows``, launched at ``now``, computes on the event loop's
        thread. Under ``auto``, on one CPU, a longer batch (``ONE_CPU_INLINE_S``, or a quiet
        one) goes on the loop only if it is expected to end before the earliest deadline of a
        request still queued for any model on the loop (``shared_loop``), since the loop,
        held by the batch, could not answer that request's timeout on time. A quiet batch is
        one expected to end before the next request of any model on the loop."""
        if self._where != "auto":
            return self._where == "loop"
        predicted = self._cost.predict(rows)
        if predicted is None:
            return False  # nothing learned yet: the worker, which never holds up the loop
        if predicted < self._inline_below_s:
            return True
        one_cpu = self._one_cpu
        low, high = ONE_CPU_INLINE_S
        if one_cpu is None or predicted >= high or not one_cpu.at_most_one():
            return False
        if predicted < low and predicted * self._expected_rate(now) >= 1.0:
            return False  # requests expected meanwhile: the loop reads them as it computes
        deadline = self._loop.earliest_deadline()
        return deadline is None or now + predicted < deadline

    def _expected_rate(self, now: float) -> float:
        """Requests per second expected at the loop: the model's own, from its mean gap (none
        before its second request), and the other models'."""
        gap = self._arrival_gap()
        own = 0.0 if gap is None else math.inf if gap <= 0.0 else 1.0 / gap
        return own + self._loop.others_rate(self._member, now)

    def close(self) -> None:
        """The model stopped: it no longer counts for the other models' batches."""
        self._loop.leave(self._member)
