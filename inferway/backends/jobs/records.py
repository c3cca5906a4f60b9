"""An asynchronous job as plain data, and every change of its state as a pure function.

The stores (embedded and Redis) and the worker only read and write these records; whether a
change is allowed (a cancelled job is never started, a finished one cannot be cancelled, a
job whose worker died is taken over at most ``max_attempts`` times) is decided here, with the
time passed in, so it is tested without a store, a clock or a network.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

__all__ = [
    "TERMINAL",
    "Callback",
    "CallbackState",
    "Job",
    "JobConflictError",
    "JobError",
    "JobNotFoundError",
    "JobState",
    "cancel",
    "describe",
    "fail",
    "job_from_json",
    "job_to_json",
    "record_delivery",
    "requeue",
    "start",
    "succeed",
]


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class CallbackState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class JobNotFoundError(LookupError):
    """No such job: never submitted, or finished longer ago than the TTL."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r} (never submitted, or expired after its TTL)")


class JobConflictError(Exception):
    """A change the job's current state does not allow (cancelling a finished job)."""


@dataclass(frozen=True, slots=True)
class Callback:
    """Where the finished job is POSTed, and how that went so far."""

    url: str
    state: CallbackState = CallbackState.PENDING
    attempts: int = 0
    last_error: str | None = None
    delivered_at: float | None = None


@dataclass(frozen=True, slots=True)
class JobError:
    """Why a job failed: the HTTP status and message a synchronous request would have got."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Job:
    """One submitted inference request. Times are Unix seconds (wall clock: a job may be
    submitted by one process and worked by another). ``binary_header`` is the request's
    Inference-Header-Content-Length, ``result_header`` the answer's; ``trace`` the W3C
    context of the submitting request (``traceparent``), for the job span's link."""

    id: str
    model: str
    version: str | None
    created_at: float
    state: JobState = JobState.QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    attempts: int = 0
    worker: str | None = None
    request_id: str | None = None
    binary_header: str | None = None
    trace: dict[str, str] = field(default_factory=dict)
    served_version: str | None = None
    result_header: int | None = None
    error: JobError | None = None
    callback: Callback | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def callback_due(self) -> bool:
        """Finished, with a callback not yet delivered nor given up on."""
        return (
            self.finished
            and self.callback is not None
            and self.callback.state is CallbackState.PENDING
        )


def start(
    job: Job, *, now: float, worker: str, reclaimed: bool, max_attempts: int, ttl_s: float
) -> Job:
    """The job taken by ``worker``. A queued job starts; a running one only when ``reclaimed``
    (its worker died and left it pending), and after ``max_attempts`` starts it fails instead:
    a request that kills its backend must not kill every backend in turn."""
    if (job.state is JobState.RUNNING and not reclaimed) or job.finished:
        raise JobConflictError(f"job {job.id} is {job.state}: it cannot be started")
    if job.attempts >= max_attempts:
        message = f"abandoned: its worker died during each of {job.attempts} attempts"
        return fail(job, now=now, ttl_s=ttl_s, error=JobError(500, message))
    return dataclasses.replace(
        job, state=JobState.RUNNING, started_at=now, attempts=job.attempts + 1, worker=worker
    )


def requeue(job: Job) -> Job:
    """A running job given back by its worker, unsettled, to wait for the next one (its
    attempt stays counted); any other job is left as it is."""
    if job.state is not JobState.RUNNING:
        return job
    return dataclasses.replace(job, state=JobState.QUEUED)


def succeed(
    job: Job, *, now: float, ttl_s: float, served_version: str, result_header: int | None
) -> Job:
    """The job's answer was stored."""
    if job.state is not JobState.RUNNING:
        raise JobConflictError(f"job {job.id} is {job.state}: its result is not wanted")
    return dataclasses.replace(
        _finish(job, JobState.SUCCEEDED, now, ttl_s),
        served_version=served_version,
        result_header=result_header,
    )


def fail(job: Job, *, now: float, ttl_s: float, error: JobError) -> Job:
    """The job's request failed as a synchronous one would have (or its workers kept dying)."""
    if job.finished:
        raise JobConflictError(f"job {job.id} is {job.state}: it cannot fail")
    return dataclasses.replace(_finish(job, JobState.FAILED, now, ttl_s), error=error)


def cancel(job: Job, *, now: float, ttl_s: float) -> Job:
    """A queued job is never computed; a running one is abandoned. Cancelling a cancelled job
    changes nothing (DELETE is idempotent); a succeeded or failed one is a conflict."""
    if job.state is JobState.CANCELLED:
        return job
    if job.finished:
        raise JobConflictError(f"job {job.id} already {job.state}: it can no longer be cancelled")
    return _finish(job, JobState.CANCELLED, now, ttl_s)


def record_delivery(job: Job, *, now: float, attempts: int, error: str | None) -> Job:
    """The outcome of delivering the callback (``error`` None: delivered)."""
    if job.callback is None:
        return job
    delivered = error is None
    callback = dataclasses.replace(
        job.callback,
        state=CallbackState.DELIVERED if delivered else CallbackState.FAILED,
        attempts=job.callback.attempts + attempts,
        last_error=error,
        delivered_at=now if delivered else None,
    )
    return dataclasses.replace(job, callback=callback)


def _finish(job: Job, state: JobState, now: float, ttl_s: float) -> Job:
    return dataclasses.replace(job, state=state, finished_at=now, expires_at=now + ttl_s)


# -- serialization (the Redis store keeps records as JSON) --------------------------------


def job_to_json(job: Job) -> bytes:
    return orjson.dumps(dataclasses.asdict(job))


def job_from_json(raw: bytes | str) -> Job:
    data: dict[str, Any] = orjson.loads(raw)
    error = data.pop("error")
    callback = data.pop("callback")
    return Job(
        **{k: v for k, v in data.items() if k != "state"},
        state=JobState(data["state"]),
        error=JobError(**error) if error is not None else None,
        callback=(
            Callback(**{**callback, "state": CallbackState(callback["state"])})
            if callback is not None
            else None
        ),
    )


def _time(seconds: float | None) -> str | None:
    """RFC 3339 in UTC with milliseconds, as the logs write times."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def describe(job: Job, result: Any | None = None) -> dict[str, Any]:
    """The job as ``GET /v2/jobs/{id}`` answers it (and the callback POSTs it): ``result`` is
    the OIP response body when the job succeeded with a JSON answer."""
    doc: dict[str, Any] = {
        "id": job.id,
        "model": job.model,
        "version": job.version,
        "status": str(job.state),
        "created_at": _time(job.created_at),
        "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
        "expires_at": _time(job.expires_at),
        "attempts": job.attempts,
        "result_url": f"/v2/jobs/{job.id}/result" if job.state is JobState.SUCCEEDED else None,
    }
    if result is not None:
        doc["result"] = result
    if job.error is not None:
        doc["error"] = {"status": job.error.status, "message": job.error.message}
    if job.callback is not None:
        cb = job.callback
        doc["callback"] = {
            "url": cb.url,
            "status": str(cb.state),
            "attempts": cb.attempts,
            "last_error": cb.last_error,
            "delivered_at": _time(cb.delivered_at),
        }
    return doc
