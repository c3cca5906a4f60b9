"""Where jobs are kept: the interface both stores offer the job service and its worker, and the
embedded store (this process's memory, the default).

A store hands out *deliveries*: a job to work, which stays the worker's until it is
acknowledged (``ack``) after its result is stored, or given back (``abandon``). The embedded
store loses everything with its process; the Redis store (redis_store.py) keeps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from inferway.backends.jobs.records import Job, JobNotFoundError, JobState, requeue

__all__ = [
    "Delivery",
    "JobStats",
    "JobStore",
    "JobStoreFullError",
    "JobStoreUnavailableError",
    "MemoryJobStore",
]


class JobStoreFullError(Exception):
    """The store holds its limit of jobs; one more is refused (429) until some expire."""

    retry_after_s = 1.0

    def __init__(self, held: int, limit: int) -> None:
        super().__init__(
            f"job store full: {held} jobs held (queued, running, or finished within the TTL), "
            f"the limit is {limit} (--jobs-max); retry later"
        )


class JobStoreUnavailableError(Exception):
    """The store cannot be reached (Redis down): the request is answered 503."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A job handed to a worker. ``token`` names it in the store (a Redis stream entry id);
    ``reclaimed``: taken over from a worker that died with it."""

    job_id: str
    token: str = ""
    reclaimed: bool = False


@dataclass(frozen=True, slots=True)
class JobStats:
    """What the metrics report: jobs held by state, jobs waiting to start, and how long the
    oldest of them has waited (0 when none waits)."""

    by_state: dict[JobState, int]
    queue_length: int
    oldest_queued_s: float


class JobStore(Protocol):
    """A place to keep jobs; every method may raise JobStoreUnavailableError."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def add(self, job: Job, request: bytes, *, now: float) -> None:
        """Keep a new queued job and its request body (JobStoreFullError at the limit)."""

    async def get(self, job_id: str) -> Job | None: ...

    async def request_body(self, job_id: str) -> bytes | None: ...

    async def result(self, job_id: str) -> bytes | None: ...

    async def update(
        self, job_id: str, change: Callable[[Job], Job], *, result: bytes | None = None
    ) -> Job:
        """Apply ``change`` atomically (JobNotFoundError; ``change``'s JobConflictError
        leaves the job as it was); ``result`` is stored in the same step."""

    async def take(self, timeout_s: float) -> Delivery | None:
        """The next job to work, jobs left by dead workers first; None after ``timeout_s``."""

    async def ack(self, delivery: Delivery) -> None:
        """The job is settled (result stored, callback tried): it is never handed out again."""

    async def abandon(self, delivery: Delivery) -> None:
        """Give the job back unsettled, to be handed out again."""

    async def sweep(self, now: float) -> None:
        """Forget jobs whose TTL has passed."""

    async def stats(self, now: float) -> JobStats: ...


class MemoryJobStore:
    """Jobs in this process: nothing to configure, gone when the process stops."""

    def __init__(self, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self._jobs: dict[str, Job] = {}
        self._requests: dict[str, bytes] = {}
        self._results: dict[str, bytes] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def add(self, job: Job, request: bytes, *, now: float) -> None:
        await self.sweep(now)
        if len(self._jobs) >= self.max_jobs:
            raise JobStoreFullError(len(self._jobs), self.max_jobs)
        self._jobs[job.id] = job
        self._requests[job.id] = request
        self._queue.put_nowait(job.id)

    async def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    async def request_body(self, job_id: str) -> bytes | None:
        return self._requests.get(job_id)

    async def result(self, job_id: str) -> bytes | None:
        return self._results.get(job_id)

    async def update(
        self, job_id: str, change: Callable[[Job], Job], *, result: bytes | None = None
    ) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        new = change(job)  # no await between the read and the write: atomic on the loop
        self._jobs[job_id] = new
        if new.finished:
            self._requests.pop(job_id, None)
        if result is not None:
            self._results[job_id] = result
        return new

    async def take(self, timeout_s: float) -> Delivery | None:
        try:
            async with asyncio.timeout(timeout_s):
                return Delivery(await self._queue.get())
        except TimeoutError:
            return None

    async def ack(self, delivery: Delivery) -> None:
        return None

    async def abandon(self, delivery: Delivery) -> None:
        job = self._jobs.get(delivery.job_id)
        if job is not None:
            self._jobs[job.id] = requeue(job)
            self._queue.put_nowait(job.id)

    async def sweep(self, now: float) -> None:
        for job_id in [
            j.id for j in self._jobs.values() if j.expires_at is not None and j.expires_at <= now
        ]:
            del self._jobs[job_id]
            self._results.pop(job_id, None)
            self._requests.pop(job_id, None)

    async def stats(self, now: float) -> JobStats:
        by_state = dict.fromkeys(JobState, 0)
        oldest: float | None = None
        for job in self._jobs.values():
            by_state[job.state] += 1
            if job.state is JobState.QUEUED and (oldest is None or job.created_at < oldest):
                oldest = job.created_at
        waited = max(0.0, now - oldest) if oldest is not None else 0.0
        return JobStats(by_state, by_state[JobState.QUEUED], waited)
