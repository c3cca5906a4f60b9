"""The job service of one backend: the store (embedded or Redis, from the settings), the
worker, the metrics, and what the HTTP routes ask of them (submit, status, cancel, result)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from inferway import background
from inferway.backends.jobs import records
from inferway.backends.jobs.metrics import JobMetrics
from inferway.backends.jobs.records import Callback, Job, JobNotFoundError
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.jobs.store import (
    JobStore,
    JobStoreFullError,
    JobStoreUnavailableError,
    MemoryJobStore,
)
from inferway.backends.jobs.worker import JobWorker, job_document

if TYPE_CHECKING:
    from inferway.backends.serving.core import ServingCore

__all__ = ["JobService", "build_job_store"]

log = logging.getLogger("inferway.backends.jobs")

STATS_INTERVAL_S = 1.0
"""How often the store's job counts are refreshed for the metrics (and expired jobs swept)."""


def build_job_store(settings: JobSettings) -> JobStore:
    """Redis Streams when ``settings.redis_url`` is set, else this process's memory."""
    if settings.redis_url is None:
        return MemoryJobStore(settings.max_jobs)
    from inferway.backends.jobs.redis_store import RedisJobStore  # redis-py only when used

    return RedisJobStore(
        settings.redis_url,
        max_jobs=settings.max_jobs,
        prefix=settings.redis_prefix,
        claim_idle_s=settings.claim_idle_s,
    )


class JobService:
    """Asynchronous jobs over ``core``: ``start`` once the HTTP app is built, ``stop`` before
    the models are unloaded."""

    def __init__(
        self,
        core: ServingCore,
        settings: JobSettings,
        *,
        store: JobStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = core
        self.settings = settings
        self.store = store if store is not None else build_job_store(settings)
        self.metrics = JobMetrics(core.metrics.registry)
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the store (JobStoreUnavailableError when Redis cannot be reached) and start
        the worker: it takes jobs once the models are loaded, those of dead workers first."""
        await self.store.open()
        self._session = aiohttp.ClientSession()
        name = getattr(self.store, "consumer", "embedded")
        worker = JobWorker(
            self.core, self.store, self.settings, self.metrics, self._session, name=name
        )
        self._tasks = [
            background.start(worker.run(), name="jobs-worker", log=log),
            background.start(self._refresh(), name="jobs-stats", log=log),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
        await self.store.close()

    async def _refresh(self) -> None:
        warned = False
        while True:
            try:
                now = self._clock()
                await self.store.sweep(now)
                self.metrics.stats = await self.store.stats(now)
                warned = False
            except JobStoreUnavailableError as exc:
                if not warned:
                    log.warning("job metrics not refreshed: %s", exc)
                warned = True
            except Exception:
                log.exception("job metrics not refreshed")
            await asyncio.sleep(STATS_INTERVAL_S)

    async def submit(
        self,
        *,
        model: str,
        version: str | None,
        body: bytes,
        binary_header: str | None,
        request_id: str | None,
        callback_url: str | None,
        trace: dict[str, str],
    ) -> Job:
        """Keep a validated request as a queued job (JobStoreFullError at the limit)."""
        job = Job(
            id=uuid.uuid4().hex,
            model=model,
            version=version,
            created_at=self._clock(),
            request_id=request_id,
            binary_header=binary_header,
            trace=trace,
            callback=Callback(callback_url) if callback_url else None,
        )
        try:
            await self.store.add(job, body, now=job.created_at)
        except JobStoreFullError:
            self.metrics.refused.labels("full").inc()
            raise
        except JobStoreUnavailableError:
            self.metrics.refused.labels("unavailable").inc()
            raise
        self.metrics.submitted.inc()
        return job

    async def get(self, job_id: str) -> Job:
        job = await self.store.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    async def document(self, job_id: str) -> dict[str, Any]:
        return await job_document(self.store, await self.get(job_id))

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel (JobConflictError once succeeded or failed); the job's document."""
        change = functools.partial(records.cancel, now=self._clock(), ttl_s=self.settings.ttl_s)
        job = await self.store.update(job_id, change)
        return await job_document(self.store, job)

    async def result(self, job_id: str) -> tuple[Job, bytes | None]:
        """The job and its stored answer (None unless it succeeded)."""
        job = await self.get(job_id)
        body = None
        if job.state is records.JobState.SUCCEEDED:
            body = await self.store.result(job_id)
        return job, body

    @property
    def where(self) -> str:
        """Where the jobs are kept, for ``inferway serve`` to print (no password)."""
        host = getattr(self.store, "where", None)
        return f"in Redis at {host}" if host else "in this process"
