"""Running one pipeline request: every step as an asyncio task that starts once the steps it
reads have finished, so independent branches overlap; each step's model call goes through
that model's own BatchExecutor (pipeline rows batch with direct traffic), or through the
cache when the step is cached and its inputs were seen before.

Step models are looked up per request, so a model hot-reloaded under a pipeline is used at
once. Tracing: a "step <name>" span per step (an "expert <model>" span per expert of a
mixture) under the request's span, current while the model is called, so the batch span
links to the step that queued the rows. The executor offers the BatchExecutor surface the
serving core uses (``infer``, ``submit``, load figures), so a pipeline is served, counted
and looked up exactly like a model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, SpanKind, TracerProvider

from inferway.backends.batching.errors import ExecutorClosedError, InvalidRequestError
from inferway.backends.models.served_model import ModelNotFoundError, ServedModel
from inferway.backends.pipelines.cache import StepCache, build_cache_key
from inferway.backends.pipelines.moe import combine_experts, route_top_k
from inferway.backends.pipelines.plan import ModelRef, PipelinePlan, PlannedStep, Source
from inferway.backends.telemetry.pipeline_metrics import PipelineMetrics
from inferway.backends.telemetry.tracing import is_tracing

__all__ = ["PipelineExecutor"]

Outputs = dict[str, np.ndarray]
T = TypeVar("T")


async def _all_or_none(aws: Sequence[Awaitable[T]]) -> list[T]:
    """Run ``aws`` as tasks; the first failure cancels the rest and is raised as it is
    (not wrapped in an ExceptionGroup: the serving core maps it to a status)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception())]
        if failed:
            raise failed[0]
        return [t.result() for t in tasks]
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:  # every sibling's failure retrieved: one is raised, none is logged
            if not task.cancelled():
                task.exception()


class PipelineExecutor:
    """Runs requests of one pipeline (see the module docstring). ``lookup`` finds a step's
    served model (raising ModelNotFoundError when none serves)."""

    def __init__(
        self,
        name: str,
        plan: PipelinePlan,
        lookup: Callable[[ModelRef], ServedModel],
        *,
        metrics: PipelineMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.plan = plan
        self.clock = clock
        self._lookup = lookup
        self._metrics = metrics
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer("inferway.backends.pipelines")
        cached = any(s.cached for s in plan.steps) and plan.cache.max_bytes > 0
        self.cache: StepCache | None = (
            StepCache(plan.cache.max_bytes, plan.cache.ttl_s, clock=clock, on_evict=self._evicted)
            if cached
            else None
        )
        self._in_flight = 0
        self._closing = False
        self._idle: asyncio.Event | None = None

    # -- the executor surface the serving core, metrics and ORCA read ------------------------

    queue_depth = 0
    """A pipeline queues nothing itself: its rows wait in its step models' queues."""
    in_flight_batches = 0

    @property
    def in_flight(self) -> int:
        """Pipeline requests being answered right now."""
        return self._in_flight

    @property
    def closed(self) -> bool:
        return self._closing

    def utilization(self) -> float:
        """0: the step models report the compute (counting it here too would count it twice)."""
        return 0.0

    def rps(self) -> float:
        return 0.0

    async def start(self) -> None:
        return None

    async def stop(self, drain: bool = True) -> None:
        """Refuse new requests and wait for those in flight (their steps' executors finish
        or fail them; ``drain`` is accepted for the executor surface)."""
        self._closing = True
        while self._in_flight:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Outputs:
        """Run the pipeline on one request; returns its outputs by pipeline output name."""
        if self._closing:
            raise ExecutorClosedError(f"pipeline {self.name!r} is stopping")
        if timeout is not None:
            limit = self.clock() + timeout
            deadline = limit if deadline is None else min(deadline, limit)
        self._in_flight += 1
        try:
            return await self._run(inputs, deadline)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._idle is not None:
                self._idle.set()
                self._idle = None

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
        span_context: trace.SpanContext | None = None,
        on_done: Callable[[asyncio.Future[Outputs]], None] | None = None,
    ) -> asyncio.Future[Outputs]:
        """``infer`` as a task (cancel it to drop the request); step spans go under
        ``span_context`` when it is valid (default: the current span); ``on_done`` is the
        task's done-callback."""
        if self._closing:
            raise ExecutorClosedError(f"pipeline {self.name!r} is stopping")

        async def run() -> Outputs:
            if span_context is not None:
                parent = trace.set_span_in_context(NonRecordingSpan(span_context))
                otel_context.attach(parent)  # this task's own context copy
            return await self.infer(inputs, deadline=deadline, timeout=timeout)

        task = asyncio.ensure_future(run())
        if on_done is not None:
            task.add_done_callback(on_done)
        return task

    # -- running the DAG -------------------------------------------------------------------

    async def _run(self, inputs: Mapping[str, np.ndarray], deadline: float | None) -> Outputs:
        results: dict[str, Outputs] = {}
        done: dict[str, asyncio.Future[None]] = {}

        def value(source: Source) -> np.ndarray:
            if source.step is None:
                return inputs[source.tensor]
            return results[source.step][source.tensor]

        async def run(step: PlannedStep) -> None:
            for dep in step.deps:
                await done[dep]
            feed = {name: value(source) for name, source in step.inputs}
            results[step.name] = await self._step(step, feed, results, deadline)

        loop = asyncio.get_running_loop()
        for step in self.plan.steps:  # in dependency order: every dep's future exists
            done[step.name] = loop.create_task(run(step), name=f"{self.name}/{step.name}")
        await _all_or_none(list(done.values()))
        return {spec.name: value(source) for spec, source in self.plan.outputs}

    async def _step(
        self,
        step: PlannedStep,
        feed: Outputs,
        results: Mapping[str, Outputs],
        deadline: float | None,
    ) -> Outputs:
        started = time.perf_counter()
        attributes: dict[str, Any] = {"inferway.pipeline": self.name, "inferway.step": step.name}
        if step.model is not None:
            attributes["inferway.model"] = step.model.name
        try:
            with self._span(f"step {step.name}", attributes) as span:
                key: bytes | None = None
                if self.cache is not None and step.cached:
                    models = [self._resolve(step, r) for r in step.refs()]
                    identity = (
                        self.name,
                        step.name,
                        *((m.name, m.version, m.fingerprint) for m in models),
                    )
                    key = build_cache_key(identity, feed)
                    hit = self.cache.get(key)
                    if self._metrics is not None:
                        self._metrics.cache_lookup(self.name, step.name, hit is not None)
                    span.set_attribute("inferway.cache", "hit" if hit is not None else "miss")
                    if hit is not None:
                        return hit
                if step.moe is not None:
                    out = await self._mixture(step, feed, results, deadline)
                else:
                    assert step.model is not None
                    model = self._resolve(step, step.model)
                    span.set_attribute("inferway.model_version", str(model.version))
                    out = await self._call(step, model, feed, deadline)
                if key is not None and self.cache is not None:
                    self.cache.put(key, out)
                    if self._metrics is not None:
                        self._metrics.cache_size(self.name, self.cache.nbytes)
                return out
        finally:
            if self._metrics is not None:
                self._metrics.step_finished(self.name, step.name, time.perf_counter() - started)

    async def _mixture(
        self,
        step: PlannedStep,
        feed: Outputs,
        results: Mapping[str, Outputs],
        deadline: float | None,
    ) -> Outputs:
        moe = step.moe
        assert moe is not None and moe.router.step is not None
        scores = results[moe.router.step][moe.router.tensor]
        routing = route_top_k(scores, moe.top_k, moe.weights)
        rows = scores.shape[0]

        async def expert(index: int, ref: ModelRef, picked: np.ndarray) -> tuple[int, Any]:
            model = self._resolve(step, ref)
            attributes = {
                "inferway.pipeline": self.name,
                "inferway.step": step.name,
                "inferway.model": ref.name,
                "inferway.expert_rows": len(picked),
            }
            with self._span(f"expert {ref.name}", attributes):
                sub = {name: array[picked] for name, array in feed.items()}
                out = await self._call(step, model, sub, deadline)
            return index, (picked, out[moe.output])

        calls: list[Awaitable[tuple[int, Any]]] = []
        for index, ref in enumerate(moe.experts):
            picked = routing.rows_of(index)
            if self._metrics is not None:
                self._metrics.expert_activated(self.name, step.name, ref.name, len(picked))
            if len(picked):
                calls.append(expert(index, ref, picked))
        ran = dict(await _all_or_none(calls))
        return {moe.output: combine_experts(routing, ran, rows)}

    # -- helpers -----------------------------------------------------------------------------

    async def _call(
        self, step: PlannedStep, model: ServedModel, feed: Outputs, deadline: float | None
    ) -> Outputs:
        """One model call of a step, through the model's batcher; a request the model cannot
        take (too many rows) is refused naming the step."""
        try:
            return await model.executor.infer(feed, deadline=deadline)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"pipeline {self.name!r} step {step.name!r}: {e}") from None

    def _resolve(self, step: PlannedStep, ref: ModelRef) -> ServedModel:
        try:
            return self._lookup(ref)
        except ModelNotFoundError as e:
            raise ExecutorClosedError(
                f"pipeline {self.name!r} step {step.name!r}: {e} (the pipeline is not ready)"
            ) from None

    @contextmanager
    def _span(self, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
        if not is_tracing(self._tracer):
            yield INVALID_SPAN
            return
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            yield span

    def _evicted(self, reason: str, count: int) -> None:
        if self._metrics is not None:
            self._metrics.cache_evicted(self.name, reason, count)
