"""Jobs in Redis Streams, so that none is lost when a backend dies.

A submission is appended to a stream, worked by a consumer group (one consumer per backend
process), and acknowledged only once its result is stored: an entry whose backend died stays
pending. Each worker keeps its own pending entries fresh (XCLAIM to itself, resetting their
idle time) and takes over any other entry idle longer than ``claim_idle_s`` (XAUTOCLAIM), on
start and then every half of that: a dead backend's jobs are finished by the next one up.

Keys, under ``prefix``: ``:stream`` (the entries), ``:job:<id>`` (the record, JSON),
``:request:<id>`` and ``:result:<id>`` (bodies), ``:states`` (hash id -> state, for the
metrics), ``:queued`` (zset of jobs waiting to start, by creation time) and ``:index`` (zset of
every job held, by expiry; +inf while unfinished) which bounds the store. Finished records and
results expire with the TTL; unfinished ones never do.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferway import background
from inferway.backends.jobs.records import (
    TERMINAL,
    Job,
    JobNotFoundError,
    JobState,
    job_from_json,
    job_to_json,
)
from inferway.backends.jobs.store import (
    Delivery,
    JobStats,
    JobStoreFullError,
    JobStoreUnavailableError,
)

__all__ = ["GROUP", "RedisJobStore"]

log = logging.getLogger("inferway.backends.jobs")

GROUP = "workers"
_ADD = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(expired) do redis.call('HDEL', KEYS[2], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then return held end
redis.call('ZADD', KEYS[1], '+inf', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], 'queued')
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[3])
redis.call('SET', KEYS[4], ARGV[4])
redis.call('SET', KEYS[5], ARGV[5])
redis.call('XADD', KEYS[6], '*', 'job', ARGV[3])
return -1
"""
"""Atomic bound check and submission: KEYS index, states, queued, record, request, stream;
ARGV now, limit, id, record JSON, request body, created_at. Returns -1, or the jobs held."""
_SWEEP = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(expired) do redis.call('HDEL', KEYS[2], id) end
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
"""
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


def _consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class RedisJobStore:
    """The job store in Redis at ``url`` (a consumer named after host, pid and a random tag)."""

    def __init__(
        self,
        url: str,
        *,
        max_jobs: int,
        prefix: str = "inferway:jobs",
        claim_idle_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_jobs = max_jobs
        self.consumer = _consumer_name()
        self.claim_idle_s = claim_idle_s
        self.where = url.partition("://")[2].rpartition("@")[2]
        """Host, port and database, for messages: never the password."""
        self._redis = aioredis.Redis.from_url(url, socket_connect_timeout=5)
        self._prefix = prefix
        self._stream = f"{prefix}:stream"
        self._states = f"{prefix}:states"
        self._queued = f"{prefix}:queued"
        self._index = f"{prefix}:index"
        self._clock = clock
        self._add_script = self._redis.register_script(_ADD)
        self._sweep_script = self._redis.register_script(_SWEEP)
        self._inflight: set[str] = set()
        self._reclaimed: deque[tuple[str, str]] = deque()
        self._next_claim = 0.0
        self._claim_cursor = "0-0"
        self._heartbeat: asyncio.Task[None] | None = None

    def _key(self, kind: str, job_id: str) -> str:
        return f"{self._prefix}:{kind}:{job_id}"

    async def open(self) -> None:
        """Check Redis answers and create the consumer group (both idempotent)."""
        try:
            await self._redis.ping()
            await self._redis.xgroup_create(self._stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        except _REDIS_DOWN as exc:
            where = self.where
            raise JobStoreUnavailableError(f"cannot reach Redis at {where}: {exc}") from exc
        self._heartbeat = background.start(self._keep_fresh(), name="jobs-redis-heartbeat", log=log)

    async def close(self) -> None:
        if self._heartbeat is not None:
            await background.cancel(self._heartbeat)
        await self._redis.aclose()

    async def _call(self, op: Any) -> Any:
        try:
            return await op
        except _REDIS_DOWN as exc:
            raise JobStoreUnavailableError(f"Redis at {self.where}: {exc}") from exc

    async def add(self, job: Job, request: bytes, *, now: float) -> None:
        keys = [self._index, self._states, self._queued, self._key("job", job.id)]
        keys += [self._key("request", job.id), self._stream]
        argv: list[bytes | str | int] = [repr(now), self.max_jobs, job.id, job_to_json(job)]
        argv += [request, repr(job.created_at)]
        held = int(await self._call(self._add_script(keys=keys, args=argv)))
        if held >= 0:
            raise JobStoreFullError(held, self.max_jobs)

    async def get(self, job_id: str) -> Job | None:
        raw = await self._call(self._redis.get(self._key("job", job_id)))
        return job_from_json(raw) if raw is not None else None

    async def request_body(self, job_id: str) -> bytes | None:
        raw: bytes | None = await self._call(self._redis.get(self._key("request", job_id)))
        return raw

    async def result(self, job_id: str) -> bytes | None:
        raw: bytes | None = await self._call(self._redis.get(self._key("result", job_id)))
        return raw

    async def update(
        self, job_id: str, change: Callable[[Job], Job], *, result: bytes | None = None
    ) -> Job:
        return await self._call(self._update(job_id, change, result))  # type: ignore[no-any-return]

    async def _update(self, job_id: str, change: Callable[[Job], Job], result: bytes | None) -> Job:
        """Optimistic: WATCH the record, apply ``change``, write in MULTI; again if another
        process wrote the record in between (a cancel racing a finish)."""
        key = self._key("job", job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        raise JobNotFoundError(job_id)
                    new = change(job_from_json(raw))
                    pipe.multi()
                    self._write(pipe, new, result)
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

    def _write(self, pipe: Any, job: Job, result: bytes | None) -> None:
        ttl: int | None = None
        if job.expires_at is not None:
            ttl = max(1, math.ceil(job.expires_at - self._clock()))
        pipe.set(self._key("job", job.id), job_to_json(job), ex=ttl)
        pipe.hset(self._states, job.id, str(job.state))
        if job.state is not JobState.QUEUED:
            pipe.zrem(self._queued, job.id)
        if job.state in TERMINAL:
            pipe.zadd(self._index, {job.id: job.expires_at})
            pipe.delete(self._key("request", job.id))
        if result is not None:
            pipe.set(self._key("result", job.id), result, ex=ttl)

    async def take(self, timeout_s: float) -> Delivery | None:
        if not self._reclaimed and self._clock() >= self._next_claim:
            await self._call(self._reclaim())
        if self._reclaimed:
            entry, job_id = self._reclaimed.popleft()
            return Delivery(job_id, entry, reclaimed=True)
        answer = await self._call(
            self._redis.xreadgroup(
                GROUP, self.consumer, {self._stream: ">"}, count=1, block=int(timeout_s * 1000)
            )
        )
        for _stream, entries in answer or ():
            for entry, fields in entries:
                self._inflight.add(entry.decode())
                return Delivery(fields[b"job"].decode(), entry.decode())
        return None

    async def _reclaim(self) -> None:
        """Take over entries idle past ``claim_idle_s``: their workers are gone."""
        cursor, entries, _deleted = await self._redis.xautoclaim(
            self._stream,
            GROUP,
            self.consumer,
            min_idle_time=int(self.claim_idle_s * 1000),
            start_id=self._claim_cursor,
            count=16,
        )
        self._claim_cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        if self._claim_cursor == "0-0":  # a full pass: rest until the next period
            self._next_claim = self._clock() + self.claim_idle_s / 2
            await self._forget_dead_consumers()
        for entry, fields in entries:
            if fields is None:  # the entry was deleted under its pending record
                continue
            name = entry.decode()
            self._inflight.add(name)
            self._reclaimed.append((name, fields[b"job"].decode()))
            log.warning(
                "took over job %s from a worker silent for %.0fs",
                fields[b"job"].decode(),
                self.claim_idle_s,
            )

    async def _forget_dead_consumers(self) -> None:
        """Drop consumers (backends gone) with nothing pending, silent for ten claim periods,
        so the group's list does not grow with every restart. A live one dropped by mistake
        is recreated by its next read."""
        silent_ms = 10 * self.claim_idle_s * 1000
        for consumer in await self._redis.xinfo_consumers(self._stream, GROUP):
            name = consumer["name"].decode()
            if name != self.consumer and consumer["pending"] == 0 and consumer["idle"] > silent_ms:
                await self._redis.xgroup_delconsumer(self._stream, GROUP, name)

    async def _keep_fresh(self) -> None:
        """Reset the idle time of this worker's pending entries, so no other takes them."""
        while True:
            await asyncio.sleep(self.claim_idle_s / 3)
            if not self._inflight:
                continue
            try:
                await self._redis.xclaim(
                    self._stream,
                    GROUP,
                    self.consumer,
                    min_idle_time=0,
                    message_ids=list(self._inflight),
                    justid=True,
                )
            except _REDIS_DOWN as exc:
                log.warning("could not refresh this worker's jobs in Redis: %s", exc)
            except Exception:
                log.exception("could not refresh this worker's jobs in Redis")

    async def ack(self, delivery: Delivery) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self._stream, GROUP, delivery.token)
            pipe.xdel(self._stream, delivery.token)
            await self._call(pipe.execute())
        self._inflight.discard(delivery.token)

    async def abandon(self, delivery: Delivery) -> None:
        # left pending and no longer kept fresh: taken over (by any worker) once idle
        self._inflight.discard(delivery.token)

    async def sweep(self, now: float) -> None:
        await self._call(self._sweep_script(keys=[self._index, self._states], args=[repr(now)]))

    async def stats(self, now: float) -> JobStats:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hvals(self._states)
            pipe.zrange(self._queued, 0, 0, withscores=True)
            states, oldest = await self._call(pipe.execute())
        by_state = dict.fromkeys(JobState, 0)
        for state in states:
            by_state[JobState(state.decode())] += 1
        waited = max(0.0, now - float(oldest[0][1])) if oldest else 0.0
        return JobStats(by_state, by_state[JobState.QUEUED], waited)
