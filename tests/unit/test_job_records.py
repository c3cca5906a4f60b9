"""The job's state transitions, its serialization and its document: pure functions, the time
passed in."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferway.backends.jobs import records
from inferway.backends.jobs.records import (
    Callback,
    CallbackState,
    Job,
    JobConflictError,
    JobError,
    JobState,
)

TTL = 60.0


def _job(**changes: object) -> Job:
    return dataclasses.replace(
        Job(id="a" * 32, model="demo", version=None, created_at=100.0), **changes
    )


def _start(job: Job, *, reclaimed: bool = False, now: float = 101.0) -> Job:
    return records.start(job, now=now, worker="w1", reclaimed=reclaimed, max_attempts=3, ttl_s=TTL)


def test_a_queued_job_starts_on_its_worker_and_counts_the_attempt() -> None:
    job = _start(_job())
    assert (job.state, job.started_at, job.attempts, job.worker) == (
        JobState.RUNNING,
        101.0,
        1,
        "w1",
    )
    assert job.finished_at is None and job.expires_at is None


@pytest.mark.parametrize("state", [JobState.CANCELLED, JobState.SUCCEEDED, JobState.FAILED])
def test_a_finished_job_is_never_started_again(state: JobState) -> None:
    with pytest.raises(JobConflictError, match=f"is {state}"):
        _start(_job(state=state), reclaimed=True)


def test_a_running_job_is_started_again_only_when_taken_over_from_a_dead_worker() -> None:
    running = _start(_job())
    with pytest.raises(JobConflictError):
        _start(running)
    again = _start(running, reclaimed=True, now=150.0)
    assert (again.state, again.attempts, again.started_at) == (JobState.RUNNING, 2, 150.0)


def test_a_running_job_given_back_waits_again_with_its_attempt_counted() -> None:
    back = records.requeue(_start(_job()))
    assert (back.state, back.attempts) == (JobState.QUEUED, 1)
    assert _start(back).attempts == 2
    cancelled = _job(state=JobState.CANCELLED)
    assert records.requeue(cancelled) is cancelled


def test_a_job_whose_workers_keep_dying_fails_after_max_attempts() -> None:
    job = _job(state=JobState.RUNNING, attempts=3)
    failed = _start(job, reclaimed=True, now=200.0)
    assert failed.state is JobState.FAILED and failed.attempts == 3
    assert failed.error == JobError(500, "abandoned: its worker died during each of 3 attempts")
    assert (failed.finished_at, failed.expires_at) == (200.0, 200.0 + TTL)


def test_a_running_job_succeeds_with_its_served_version_and_expires_after_the_ttl() -> None:
    done = records.succeed(
        _start(_job()), now=110.0, ttl_s=TTL, served_version="2", result_header=None
    )
    assert (done.state, done.served_version, done.finished_at) == (JobState.SUCCEEDED, "2", 110.0)
    assert done.expires_at == 110.0 + TTL


def test_a_result_for_a_job_cancelled_meanwhile_is_refused() -> None:
    cancelled = records.cancel(_start(_job()), now=105.0, ttl_s=TTL)
    with pytest.raises(JobConflictError, match="not wanted"):
        records.succeed(cancelled, now=110.0, ttl_s=TTL, served_version="1", result_header=None)
    with pytest.raises(JobConflictError):
        records.fail(cancelled, now=110.0, ttl_s=TTL, error=JobError(500, "x"))


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING])
def test_cancelling_an_unfinished_job_finishes_it_as_cancelled(state: JobState) -> None:
    cancelled = records.cancel(_job(state=state), now=120.0, ttl_s=TTL)
    assert (cancelled.state, cancelled.finished_at) == (JobState.CANCELLED, 120.0)
    assert records.cancel(cancelled, now=130.0, ttl_s=TTL) is cancelled  # idempotent


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED])
def test_cancelling_a_finished_job_is_a_conflict(state: JobState) -> None:
    with pytest.raises(JobConflictError, match=f"already {state}"):
        records.cancel(_job(state=state), now=120.0, ttl_s=TTL)


def test_a_callback_is_due_once_the_job_is_finished_until_delivered_or_given_up() -> None:
    job = _job(callback=Callback("http://127.0.0.1:9/hook"))
    assert not job.callback_due
    done = records.cancel(job, now=120.0, ttl_s=TTL)
    assert done.callback_due
    delivered = records.record_delivery(done, now=121.0, attempts=2, error=None)
    assert delivered.callback == Callback(
        "http://127.0.0.1:9/hook", CallbackState.DELIVERED, 2, None, 121.0
    )
    assert not delivered.callback_due
    failed = records.record_delivery(done, now=121.0, attempts=4, error="HTTP 500")
    assert failed.callback is not None and failed.callback.state is CallbackState.FAILED
    assert not failed.callback_due
    assert records.record_delivery(_job(), now=1.0, attempts=1, error=None) == _job()


_jobs = st.builds(
    Job,
    id=st.text(min_size=1, max_size=8),
    model=st.text(max_size=8),
    version=st.none() | st.text(max_size=4),
    created_at=st.floats(0, 2e9),
    state=st.sampled_from(JobState),
    started_at=st.none() | st.floats(0, 2e9),
    attempts=st.integers(0, 5),
    request_id=st.none() | st.text(max_size=8),
    binary_header=st.none() | st.text("0123456789", min_size=1, max_size=4),
    trace=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    result_header=st.none() | st.integers(0, 1000),
    error=st.none() | st.builds(JobError, st.integers(400, 599), st.text(max_size=8)),
    callback=st.none()
    | st.builds(Callback, st.text(max_size=8), st.sampled_from(CallbackState), st.integers(0, 5)),
)


@given(_jobs)
def test_a_job_survives_its_json_round_trip(job: Job) -> None:
    assert records.job_from_json(records.job_to_json(job)) == job


def test_the_job_document_names_its_times_in_utc_and_its_result_once_succeeded() -> None:
    job = records.succeed(
        _start(_job()), now=110.5, ttl_s=TTL, served_version="1", result_header=None
    )
    doc = records.describe(job, {"outputs": []})
    assert doc["status"] == "succeeded" and doc["result"] == {"outputs": []}
    assert doc["created_at"] == "1970-01-01T00:01:40.000+00:00"
    assert doc["finished_at"] == "1970-01-01T00:01:50.500+00:00"
    assert doc["result_url"] == f"/v2/jobs/{job.id}/result"
    queued = records.describe(_job())
    assert queued["result_url"] is None and "result" not in queued and "error" not in queued
    failed = records.describe(
        records.fail(_job(), now=101.0, ttl_s=TTL, error=JobError(504, "deadline exceeded"))
    )
    assert failed["error"] == {"status": 504, "message": "deadline exceeded"}
