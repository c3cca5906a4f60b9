"""The jobs' small pure parts: reading ``Prefer``, checking settings and callback URLs, and the
embedded store's bound, expiry and counts (in memory, the time passed in)."""

from __future__ import annotations

import pytest

from inferway.backends.jobs import records
from inferway.backends.jobs.callbacks import check_callback_url
from inferway.backends.jobs.http_routes import prefers_async
from inferway.backends.jobs.records import Job, JobNotFoundError, JobState
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.jobs.store import Delivery, JobStoreFullError, MemoryJobStore


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["respond-async"], True),
        (["Respond-Async"], True),
        (["wait=10, respond-async"], True),
        (["return=minimal", "respond-async; foo=bar"], True),
        (["respond-async=1"], True),
        ([], False),
        (["return=representation"], False),
        (["respond-asynchronously"], False),
    ],
)
def test_prefer_asks_for_an_asynchronous_answer_only_with_the_respond_async_token(
    values: list[str], expected: bool
) -> None:
    assert prefers_async(values) is expected


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_jobs": 0}, "max_jobs must be a whole number >= 1"),
        ({"concurrency": True}, "concurrency must be a whole number >= 1"),
        ({"ttl_s": 0}, "ttl_s must be > 0 seconds"),
        ({"callback_retries": -1}, "callback_retries must be >= 0"),
        ({"timeout_s": -1.0}, "timeout_s must be > 0 seconds or None"),
        ({"redis_url": "http://:secret@h:1"}, "got 'http':... (the rest unprinted"),
    ],
)
def test_job_settings_refuse_what_cannot_work_and_say_why(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        JobSettings(**changes)  # type: ignore[arg-type]
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("url", ["ftp://h/x", "/relative", "http://", "h:80/x"])
def test_a_callback_must_be_an_absolute_http_url(url: str) -> None:
    with pytest.raises(ValueError, match="absolute http"):
        check_callback_url(url)
    assert check_callback_url("https://hooks.example/x?y=1") == "https://hooks.example/x?y=1"


def _job(n: int, created_at: float = 100.0) -> Job:
    return Job(id=f"{n:032x}", model="demo", version=None, created_at=created_at)


async def test_the_embedded_store_is_bounded_until_finished_jobs_expire() -> None:
    store = MemoryJobStore(max_jobs=2)
    await store.add(_job(1), b"one", now=100.0)
    await store.add(_job(2), b"two", now=100.0)
    with pytest.raises(JobStoreFullError, match="2 jobs held"):
        await store.add(_job(3), b"three", now=100.0)
    done = await store.update(
        _job(1).id, lambda j: records.cancel(j, now=101.0, ttl_s=10.0), result=None
    )
    assert done.expires_at == 111.0 and await store.request_body(done.id) is None
    with pytest.raises(JobStoreFullError):  # finished but still within its TTL
        await store.add(_job(3), b"three", now=110.0)
    await store.add(_job(3), b"three", now=111.0)
    assert await store.get(_job(1).id) is None
    with pytest.raises(JobNotFoundError):
        await store.update(_job(1).id, lambda j: j)


async def test_the_embedded_store_hands_out_jobs_in_order_and_counts_them_by_state() -> None:
    store = MemoryJobStore(max_jobs=10)
    await store.add(_job(1, created_at=90.0), b"", now=100.0)
    await store.add(_job(2, created_at=95.0), b"", now=100.0)
    first = await store.take(1.0)
    assert first == Delivery(_job(1).id)
    await store.update(
        _job(1).id,
        lambda j: records.start(j, now=100.0, worker="w", reclaimed=False, max_attempts=3, ttl_s=5),
    )
    stats = await store.stats(now=100.0)
    assert stats.by_state[JobState.RUNNING] == 1 and stats.queue_length == 1
    assert stats.oldest_queued_s == 5.0
    await store.abandon(first)  # given back: handed out again, its attempt counted
    again = await store.get(_job(1).id)
    assert again is not None and again.state is JobState.QUEUED and again.attempts == 1
    assert await store.take(1.0) == Delivery(_job(2).id)
    assert await store.take(1.0) == Delivery(_job(1).id)
    assert await store.take(0.01) is None
