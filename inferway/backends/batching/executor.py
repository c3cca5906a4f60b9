"""The asyncio shell around the pure Scheduler: futures, worker threads, numpy and tracing.

The scheduler is asked what to do right where its answer can change: once per pass of the
event loop that saw a submit (after the loop has read every request that was ready, so they
can share a batch; one decision for all of them, not one per request), and in the callback
that a worker thread posts when a batch finishes (one hop onto the loop; the next batch is
launched before the finished batch's futures are resolved, so a busy event loop never leaves
an instance idle). One dispatcher task per model covers the rest: the time the scheduler
named, cancels, and draining on stop. Each model instance owns one worker thread, so a
runner's ``run`` is never called concurrently.

Its collaborators are composed: the Scheduler decides, the Dispatcher (``dispatcher.py``) owns
the timer task, the BatchReporter (``reporting.py``) makes spans and batch records, WindowStats
keeps ORCA's load figures. A queued request is one typed record (``QueuedRequest``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry import trace

from ..runners.base import Runner
from .batch_tensors import run_batch
from .client_gone import client_gone_check
from .config import BatchingConfig
from .cpu_allowance import CpuAllowance
from .dispatcher import Dispatcher
from .errors import DeadlineExceededError, ExecutorClosedError
from .inputs import Inputs, Outputs, describe_inputs
from .loop_load import LoopLoad, this_threads_loop_load
from .placement import INLINE_BELOW_S, BatchPlacement
from .queued import QueuedRequest, abandoned, fail
from .records import BatchRecord, Dispatch, Idle, WaitUntil
from .reporting import BatchReporter
from .scheduler import Scheduler
from .shared_loop import SharedLoop
from .window_stats import WindowStats

__all__ = ["BatchExecutor"]

log = logging.getLogger(__name__)


class BatchExecutor:
    """Batches ``infer`` calls of one model version over its runner instances.

    ``deadline`` values are absolute times on ``clock`` (``time.monotonic`` by default);
    ``timeout`` is the relative shorthand. The executor owns its runners: ``stop`` closes them.
    """

    def __init__(
        self,
        runners: Sequence[Runner],
        config: BatchingConfig,
        *,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[BatchRecord], None] | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        stats_window_s: float = 10.0,
        inline_below_s: float = INLINE_BELOW_S,
        measure_loop: bool = False,
        cpu_allowance: CpuAllowance | None = None,
        shared_loop: SharedLoop | None = None,
    ) -> None:
        if not runners:
            raise ValueError(f"model {name!r}: BatchExecutor needs at least one runner")
        self.name = name
        self.config = config
        self.clock = clock
        self._runners = list(runners)
        self._sched: Scheduler[QueuedRequest] = Scheduler(
            config, instances=len(self._runners), name=name
        )
        self._reporter = BatchReporter(name, on_batch=on_batch, tracer_provider=tracer_provider)
        self._dispatcher = Dispatcher(
            name, pump=self._pump, clock=clock, on_crash=self._on_dispatcher_crash
        )
        self._pools = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{name}-{i}")
            for i in range(len(self._runners))
        ]
        self._idle: list[int] = list(reversed(range(len(self._runners))))
        self._in_flight = 0
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # set once started
        self._closing = False
        self._drain = True
        self._closed = False
        self._stats = WindowStats(len(self._runners), stats_window_s, clock())
        self._placement = BatchPlacement(
            config.compute_thread,
            self._runners,
            self._sched.cost_model,
            next_deadline=self._sched.next_deadline,
            arrival_gap=lambda: self._sched.arrivals.mean_gap,
            expected_wait=self._sched.arrivals.expected_wait,
            shared_loop=shared_loop,
            inline_below_s=inline_below_s,
            cpu_allowance=cpu_allowance,
        )
        self.batches_on_loop = 0
        """Batches computed on the event loop's thread (``compute_thread``), since started."""
        # fill_when_busy's loop share, measured once started (off by default: deterministic tests)
        self._measure_loop = measure_loop and config.mode == "adaptive" and config.fill_when_busy
        self._loop_load: LoopLoad | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def scheduler(self) -> Scheduler[QueuedRequest]:
        return self._sched

    @property
    def instances(self) -> int:
        return len(self._runners)

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch."""
        return self._sched.queued

    @property
    def in_flight_batches(self) -> int:
        return self._in_flight

    @property
    def closed(self) -> bool:
        return self._closing

    def utilization(self) -> float:
        """Busy fraction of all instances over the recent stats window, in [0, 1]."""
        return self._stats.utilization(self.clock())

    def rps(self) -> float:
        """Requests computed per second over the recent stats window."""
        return self._stats.rps(self.clock())

    async def start(self) -> None:
        self._start_now()

    async def stop(self, drain: bool = True) -> None:
        """Refuse new requests; finish queued ones (``drain``) or fail them with
        ExecutorClosedError; wait for running batches; close the runners."""
        if not self._closing:
            self._closing = True
            self._drain = drain
        elif not drain:
            self._drain = False
        self._dispatcher.wake()
        await self._dispatcher.join()
        if self._closed:
            return
        self._closed = True
        self._placement.close()
        for pool in self._pools:
            pool.shutdown(wait=False)
        for runner in self._runners:
            try:
                runner.close()
            except Exception:
                log.exception("model %r: closing a runner failed", self.name)

    async def infer(
        self, inputs: Inputs, *, deadline: float | None = None, timeout: float | None = None
    ) -> Outputs:
        """Run one request (batch dimension first) as part of a batch; returns its rows.
        Cancelling the caller drops the request if it is still queued."""
        fut, request_id = self._enqueue(inputs, deadline, timeout, None)
        try:
            return await fut
        except asyncio.CancelledError:  # no done-callback per request on this hot path
            self._forget(request_id)
            raise

    def submit(
        self,
        inputs: Inputs,
        *,
        deadline: float | None = None,
        timeout: float | None = None,
        span_context: trace.SpanContext | None = None,
        on_done: Callable[[asyncio.Future[Outputs]], None] | None = None,
    ) -> asyncio.Future[Outputs]:
        """Queue one request without a coroutine of its own; the future gets its rows (or
        the error). Cancelling the future drops the request if it is still queued. Batch
        spans link to ``span_context`` (default: the current span's). ``on_done`` is called
        with the future once it is done, as a done-callback would be (one callback a request
        instead of two: this path is per request)."""
        fut, request_id = self._enqueue(inputs, deadline, timeout, span_context)

        def settled(done: asyncio.Future[Outputs]) -> None:
            if done.cancelled():
                self._forget(request_id)
            if on_done is not None:
                on_done(done)

        fut.add_done_callback(settled)
        return fut

    def _enqueue(
        self,
        inputs: Inputs,
        deadline: float | None,
        timeout: float | None,
        span_context: trace.SpanContext | None,
    ) -> tuple[asyncio.Future[Outputs], int]:
        if self._closing:
            raise ExecutorClosedError(f"model {self.name!r}: executor is stopping")
        if self._loop is None:
            self._start_now()
        rows, nbytes, key = describe_inputs(inputs)
        now = self.clock()
        if timeout is not None:
            limit = now + timeout
            deadline = limit if deadline is None else min(deadline, limit)
        if deadline is not None and deadline <= now:
            raise DeadlineExceededError(f"model {self.name!r}: deadline passed before queueing")
        assert self._loop is not None
        fut: asyncio.Future[Outputs] = self._loop.create_future()
        if span_context is None:
            span_context = trace.get_current_span().get_span_context()
        request_id = next(self._ids)
        req = QueuedRequest(
            request_id,
            rows,
            nbytes,
            key,
            now,
            deadline,
            inputs=inputs,
            future=fut,
            span_context=span_context,
            gone=client_gone_check.get(),
        )
        self._sched.submit(req, now)
        self._dispatcher.pump_soon()  # decided once the loop has read what else is ready
        return fut, request_id

    def _forget(self, request_id: int) -> None:
        """A caller gave up: drop its request if it is still queued."""
        if self._sched.cancel(request_id) is not None:
            self._dispatcher.wake()

    # -- internals ------------------------------------------------------------------------

    def _start_now(self) -> None:
        if self._loop is not None:
            return
        if self._closing:
            raise ExecutorClosedError(f"model {self.name!r}: executor was stopped")
        self._loop = asyncio.get_running_loop()
        if self._measure_loop:
            self._loop_load = this_threads_loop_load()
        self._stats.restart(self.clock())
        self._dispatcher.start(self._loop)

    def _on_dispatcher_crash(self) -> None:
        self._closing = True
        for req in self._sched.clear():
            fail(req, ExecutorClosedError(f"model {self.name!r}: dispatcher failed"))

    def _pump(self) -> WaitUntil | Idle | None:
        """Expire overdue requests and launch every batch the scheduler wants now; returns what
        to wait for next (None: stopped and drained). Called on the loop thread only."""
        sched = self._sched
        if self._loop_load is not None:
            sched.loop_busy = self._loop_load.share()
        while True:
            now = self.clock()
            for req in sched.expire(now):
                fail(
                    req,
                    DeadlineExceededError(
                        f"model {self.name!r}: deadline passed after "
                        f"{now - req.arrival:.3f}s in the queue; not computed"
                    ),
                )
            if self._closing and not self._drain and sched.queued:
                for req in sched.clear():
                    fail(req, ExecutorClosedError(f"model {self.name!r}: stopped"))
            action = sched.next_action(now, len(self._idle), flush=self._closing)
            if isinstance(action, Dispatch):
                self._launch(action, now)
                continue
            if self._closing and not sched.queued and self._in_flight == 0:
                self._dispatcher.wake()
                return None
            # The dispatcher must look again by ``action.at``: wake it if its timer is later.
            if type(action) is WaitUntil:
                timer = self._dispatcher.sleeping_until
                if timer is None or action.at < timer:
                    self._dispatcher.wake()
            return action

    def _launch(self, batch: Dispatch[QueuedRequest], now: float) -> None:
        assert self._loop is not None
        live = tuple(req for req in batch.requests if not abandoned(req))
        if len(live) < len(batch.requests):
            # cancelled after the scheduler took it, before its forget callback ran (both
            # wait for the loop's next pass), or its client hung up and the loop has not read
            # it yet: nobody waits for these rows
            if not live:  # the pump asks the scheduler again
                return
            batch = Dispatch(live, sum(r.rows for r in live), sum(r.nbytes for r in live))
        instance = self._idle.pop()
        self._in_flight += 1
        self._stats.begin(instance, now)
        if self._placement.on_loop(batch.rows, now):
            self._run_inline(instance, batch, now)
            return
        span = self._reporter.start_span(instance, batch.requests, batch.rows, now)
        self._pools[instance].submit(self._work, instance, batch, now, span)

    def _settle(
        self,
        instance: int,
        batch: Dispatch[QueuedRequest],
        started: float,
        span: trace.Span,
        results: list[Outputs] | None,
        compute_s: float,
        error: BaseException | None,
        *,
        pump: bool,
    ) -> None:
        """Free the instance (with ``pump``, launch what waits for it at once), then resolve
        the batch's futures, close its span and report it."""
        end = self.clock()
        self._stats.end(instance, len(batch.requests), end)
        self._idle.append(instance)
        self._in_flight -= 1
        if error is None:
            self._sched.on_dispatch_done(batch.rows, compute_s, end, requests=len(batch.requests))
        try:
            if pump:
                self._pump()
        finally:
            try:
                if error is not None:
                    span.record_exception(error)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))
                    for req in batch.requests:
                        fail(req, error)
                else:
                    assert results is not None
                    for req, res in zip(batch.requests, results, strict=True):
                        fut = req.future
                        if not fut.done():
                            fut.set_result(res)
            finally:
                span.end()
                self._reporter.report(
                    instance, batch.requests, batch.rows, started, compute_s, error
                )

    def _run_inline(self, instance: int, batch: Dispatch[QueuedRequest], started: float) -> None:
        """Compute a batch right here, on the event loop thread (``BatchPlacement``)."""
        self.batches_on_loop += 1
        span = self._reporter.start_span(
            instance, batch.requests, batch.rows, started, on_loop=True
        )
        try:
            results, compute_s = run_batch(self.name, self._runners[instance], batch, self.clock)
        except BaseException as exc:
            self._settle(instance, batch, started, span, None, 0.0, exc, pump=False)
            if not isinstance(exc, Exception):
                raise
        else:  # the pump that launched this batch goes on with the next one
            self._settle(instance, batch, started, span, results, compute_s, None, pump=False)

    def _work(
        self, instance: int, batch: Dispatch[QueuedRequest], started: float, span: trace.Span
    ) -> None:
        """Worker-thread body: compute, then post the outcome to the loop in one hop."""
        try:
            results, compute_s = run_batch(self.name, self._runners[instance], batch, self.clock)
        except BaseException as exc:
            outcome: tuple[Any, ...] = (None, 0.0, exc)
        else:
            outcome = (results, compute_s, None)
        assert self._loop is not None
        # One hop onto the loop: free the instance and launch the next batch, then answer.
        settle = functools.partial(
            self._settle, instance, batch, started, span, *outcome, pump=True
        )
        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            log.warning("model %r: batch finished after its event loop closed", self.name)
