"""The job worker: takes jobs from the store, runs each through the serving core, stores the
answer, delivers the callback, and only then acknowledges the job, so a worker that dies at
any point leaves the job to be finished by the next one (with the Redis store).

A running job checks every ``cancel_poll_s`` whether it was cancelled (by any backend) and is
then abandoned: its request is cancelled like a client hanging up, dropped if still queued in
the batcher. Each job runs under a span "job <model>" linked to the submitting request's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanKind, Tracer

from inferway.backends.jobs import records
from inferway.backends.jobs.call import JOB, JobAnswer, JobCall
from inferway.backends.jobs.callbacks import deliver_callback
from inferway.backends.jobs.metrics import JobMetrics
from inferway.backends.jobs.records import (
    Job,
    JobConflictError,
    JobError,
    JobNotFoundError,
    JobState,
)
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.jobs.store import Delivery, JobStore, JobStoreUnavailableError
from inferway.backends.serving.failures import Failure
from inferway.backends.telemetry import tracing

if TYPE_CHECKING:
    from inferway.backends.serving.core import ServingCore

__all__ = ["JobWorker", "job_document", "job_span"]

log = logging.getLogger("inferway.backends.jobs")

_INTERNAL = grpc.StatusCode.INTERNAL


async def job_document(store: JobStore, job: Job) -> dict[str, Any]:
    """The job as GET /v2/jobs/{id} shows it, with its JSON answer once succeeded (a binary
    answer is fetched from ``result_url``)."""
    result = None
    if job.state is JobState.SUCCEEDED and job.result_header is None:
        raw = await store.result(job.id)
        if raw is not None:
            result = json.loads(raw)  # the stdlib: the answer may carry NaN, as OIP JSON does
    return records.describe(job, result)


@contextlib.contextmanager
def job_span(tracer: Tracer, job: Job) -> Iterator[Span]:
    """A CONSUMER span "job <model>" starting a trace of its own (the job may run long after,
    and in another process than, its submission), linked to the submitting request's span."""
    if not tracing.is_tracing(tracer):
        yield INVALID_SPAN
        return
    links = []
    if job.trace:
        submitted = trace.get_current_span(propagate.extract(job.trace)).get_span_context()
        if submitted.is_valid:
            links.append(Link(submitted))
    attributes: dict[str, str | int] = {
        "inferway.job_id": job.id,
        "inferway.model": job.model,
        "inferway.job_attempt": job.attempts,
    }
    if job.request_id:
        attributes[tracing.REQUEST_ID_ATTRIBUTE] = job.request_id
    with tracer.start_as_current_span(
        f"job {job.model}", context=Context(), kind=SpanKind.CONSUMER, links=links,
        attributes=attributes,
    ) as span:  # fmt: skip
        yield span


class JobWorker:
    """Works up to ``settings.concurrency`` jobs at once from ``store`` through ``core``."""

    def __init__(
        self,
        core: ServingCore,
        store: JobStore,
        settings: JobSettings,
        metrics: JobMetrics,
        session: aiohttp.ClientSession,
        *,
        name: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self._core = core
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._session = session
        self._clock = clock

    async def run(self) -> None:
        """Work jobs until cancelled; jobs in progress are then left to the store (Redis:
        pending, taken over by the next worker)."""
        while not self._core.repository.loaded:  # a job before its model is loaded would fail
            await asyncio.sleep(0.05)
        slots = asyncio.Semaphore(self._settings.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            slots.release()

        try:
            while True:
                await slots.acquire()
                try:
                    delivery = await self._store.take(1.0)
                except Exception as exc:  # Redis down: keep trying, the jobs are safe there
                    slots.release()
                    log.warning("could not take a job from the store: %s", exc)
                    await asyncio.sleep(1.0)
                    continue
                if delivery is None:
                    slots.release()
                    continue
                task = asyncio.create_task(self._settle(delivery), name=f"job {delivery.job_id}")
                tasks.add(task)
                task.add_done_callback(done)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _settle(self, delivery: Delivery) -> None:
        try:
            await self._work(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, JobStoreUnavailableError):
                log.warning("job %s left for later: %s", delivery.job_id, exc)
            else:
                log.exception("job %s failed unexpectedly; left for later", delivery.job_id)
            with contextlib.suppress(Exception):
                await self._store.abandon(delivery)

    async def _work(self, delivery: Delivery) -> None:
        s = self._settings
        now = self._clock()
        start = functools.partial(
            records.start,
            now=now,
            worker=self.name,
            reclaimed=delivery.reclaimed,
            max_attempts=s.max_attempts,
            ttl_s=s.ttl_s,
        )
        try:
            job = await self._store.update(delivery.job_id, start)
        except JobNotFoundError:  # expired: nothing left to do
            await self._store.ack(delivery)
            return
        except JobConflictError:  # cancelled while queued, or finished before a crash
            settled = await self._store.get(delivery.job_id)
            if settled is not None and settled.callback_due:
                await self._deliver(settled)
            await self._store.ack(delivery)
            return
        if job.state is JobState.RUNNING:
            self._metrics.queue_wait.observe(max(0.0, now - job.created_at))
            job = await self._compute(job)
        self._metrics.finished.labels(str(job.state)).inc()
        if job.finished_at is not None:
            self._metrics.duration.labels(str(job.state)).observe(
                max(0.0, job.finished_at - job.created_at)
            )
        if job.callback_due:
            await self._deliver(job)
        await self._store.ack(delivery)

    async def _compute(self, job: Job) -> Job:
        """Run the job, abandoning it when cancelled; the job as finally stored."""
        s = self._settings
        body = await self._store.request_body(job.id)
        if body is None:
            return await self._finish(job, None, Failure(500, _INTERNAL, "request body lost"))
        task = asyncio.create_task(self._infer(job, body))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=s.cancel_poll_s)
                if task.done():
                    break
                current = await self._store.get(job.id)
                if current is None or current.state is JobState.CANCELLED:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    log.info("job %s cancelled while running: abandoned", job.id)
                    return current or records.cancel(job, now=self._clock(), ttl_s=s.ttl_s)
        finally:
            if not task.done():  # this worker is stopping
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        answer, failure = task.result()
        return await self._finish(job, answer, failure)

    async def _infer(self, job: Job, body: bytes) -> tuple[JobAnswer | None, Failure | None]:
        call = JobCall(job.model, job.version, body, job.binary_header, self._settings.timeout_s)
        with job_span(self._core.tracer, job) as span:
            answer, failure = await self._core.infer(call, JOB, request_id=job.request_id)
            tracing.set_span_outcome(
                span,
                code=JOB.code(failure),
                version=answer.version if answer is not None else "",
                error=failure.message if failure is not None else None,
                fault=failure is not None and failure.http_status >= 500,
            )
        return answer, failure

    async def _finish(self, job: Job, answer: JobAnswer | None, failure: Failure | None) -> Job:
        """Store the outcome in one step with the job's new state; a job cancelled meanwhile
        stays cancelled and its answer is dropped."""
        now, ttl = self._clock(), self._settings.ttl_s
        change: Callable[[Job], Job]
        if answer is not None:
            change = functools.partial(
                records.succeed,
                now=now,
                ttl_s=ttl,
                served_version=answer.version,
                result_header=answer.binary_header,
            )
        else:
            error = failure or Failure(500, _INTERNAL, "no answer")
            change = functools.partial(
                records.fail, now=now, ttl_s=ttl, error=JobError(error.http_status, error.message)
            )
        try:
            return await self._store.update(
                job.id, change, result=answer.body if answer is not None else None
            )
        except (JobConflictError, JobNotFoundError):
            return await self._store.get(job.id) or records.cancel(job, now=now, ttl_s=ttl)

    async def _deliver(self, job: Job) -> Job:
        assert job.callback is not None
        s = self._settings
        document = await job_document(self._store, job)
        outcome = await deliver_callback(
            self._session,
            job.callback.url,
            document,
            timeout_s=s.callback_timeout_s,
            retries=s.callback_retries,
            backoff_s=s.callback_backoff_s,
        )
        self._metrics.callbacks.labels("delivered" if outcome.error is None else "failed").inc()
        record = functools.partial(
            records.record_delivery,
            now=self._clock(),
            attempts=outcome.attempts,
            error=outcome.error,
        )
        try:
            return await self._store.update(job.id, record)
        except JobNotFoundError:
            return job
