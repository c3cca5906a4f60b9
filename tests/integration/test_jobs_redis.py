"""Asynchronous jobs kept in Redis Streams: a real ``redis-server`` (Debian's package, started
here), real ``inferway serve`` processes over real ONNX Runtime, HTTP clients and a callback
receiver on loopback. A backend SIGKILLed in the middle of its jobs loses none of them: the
next backend up takes them over and finishes them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import redis

from inferway.backends.jobs.redis_store import GROUP
from tests.jobs_support import (
    SLOW_WINDOW_S,
    CallbackReceiver,
    RedisServer,
    ServeProcess,
    metric,
    slow_body,
    submit,
    wait_for_job,
    write_job_repository,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs_binary("redis-server", "the jobs' Redis Streams store"),
]

STREAM = "inferway:jobs:stream"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_job_repository(tmp_path_factory.mktemp("jobs-redis"))


@pytest.fixture(scope="module")
def backend(redis_server: RedisServer, models: Path) -> Iterator[ServeProcess]:
    extra = ["--jobs-redis", f"{redis_server.url}/0", "--jobs-concurrency", "1"]
    serve = ServeProcess(models, models.parent / "serve.log", extra)
    try:
        yield serve.wait_ready()
    finally:
        serve.stop()


@pytest.fixture
async def session(backend: ServeProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=backend.url) as s:
        yield s


def _pending(redis_server: RedisServer, db: int) -> int:
    client = redis.Redis(port=redis_server.port, db=db)
    try:
        return int(client.xpending(STREAM, GROUP)["pending"])
    finally:
        client.close()


async def test_a_job_in_redis_is_submitted_polled_and_acknowledged_once_stored(
    session: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    status, doc, headers = await submit(session, "slow", slow_body(1.5, rows=2))
    assert status == 202 and headers["Location"] == f"/v2/jobs/{doc['id']}"
    done = await wait_for_job(session, doc["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    assert done["result"]["outputs"][0]["data"] == [3.0] * 8
    assert _pending(redis_server, 0) == 0, "a stored job is still pending in the stream"
    client = redis.Redis(port=redis_server.port)
    try:
        ttl = client.ttl(f"inferway:jobs:job:{doc['id']}")
    finally:
        client.close()
    assert 0 < ttl <= 3600, "a finished job's record must expire with the TTL"


async def test_a_job_in_redis_is_cancelled_and_its_callback_delivered(
    session: aiohttp.ClientSession,
) -> None:
    async with CallbackReceiver() as receiver:
        hook = {"Inferway-Callback": receiver.url}
        _, running, _ = await submit(session, "slow", slow_body(1.0), hook)
        await wait_for_job(session, running["id"], {"running"})
        _, queued, _ = await submit(session, "slow", slow_body(2.0), hook)
        for job in (queued, running):
            async with session.delete(f"/v2/jobs/{job['id']}") as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "cancelled"
        for job in (queued, running):
            settled = await wait_for_job(
                session,
                job["id"],
                {"cancelled"},
                until=lambda d: d["callback"]["status"] == "delivered",
            )
            assert settled["callback"]["attempts"] == 1
    never = await wait_for_job(session, queued["id"], {"cancelled"})
    assert never["started_at"] is None
    assert sorted(d["id"] for d in receiver.received) == sorted([queued["id"], running["id"]])
    assert {d["status"] for d in receiver.received} == {"cancelled"}
    delivered = await metric(session, "inferway_backend_jobs_callbacks_total", outcome="delivered")
    assert delivered >= 2


async def test_jobs_of_a_backend_killed_mid_job_are_finished_by_the_next_one(
    redis_server: RedisServer, models: Path
) -> None:
    # a database of its own: the module's backend must not take these jobs over
    extra = ["--jobs-redis", f"{redis_server.url}/1", "--jobs-claim-idle", "1"]
    first = ServeProcess(
        models, models.parent / "first.log", [*extra, "--jobs-concurrency", "1"]
    ).wait_ready()
    second: ServeProcess | None = None
    try:
        async with aiohttp.ClientSession(base_url=first.url) as s:
            _, running, _ = await submit(s, "slow", slow_body(1.0))
            await wait_for_job(s, running["id"], {"running"})
            _, queued, _ = await submit(s, "slow", slow_body(2.0))
        first.kill()  # mid-job: one running (in the model's window), one queued behind it
        assert _pending(redis_server, 1) == 1
        # two at once: the taken-over job and the one that waited fill one batch together
        second = ServeProcess(
            models, models.parent / "second.log", [*extra, "--jobs-concurrency", "2"]
        ).wait_ready()
        async with aiohttp.ClientSession(base_url=second.url) as s:
            timeout = SLOW_WINDOW_S + 30
            taken_over = await wait_for_job(s, running["id"], {"succeeded", "failed"}, timeout)
            assert taken_over["status"] == "succeeded", taken_over
            assert taken_over["attempts"] == 2
            assert taken_over["result"]["outputs"][0]["data"] == [2.0] * 4
            waited = await wait_for_job(s, queued["id"], {"succeeded", "failed"}, timeout)
            assert waited["status"] == "succeeded" and waited["attempts"] == 1
            assert waited["result"]["outputs"][0]["data"] == [4.0] * 4
        assert _pending(redis_server, 1) == 0
        assert "took over job " + running["id"] in second.log()
    finally:
        first.stop()
        if second is not None:
            second.stop()
