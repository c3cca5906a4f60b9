"""``etcd://host:port[,host:port…][/prefix]``: the fleet's store on etcd v3, through ``aetcd``
(a maintained asyncio client over etcd's own gRPC API; docs/fleet.md says why).

- Records are keys under the prefix; a record's version is etcd's ``mod_revision``.
- The election is one key per name, written in a transaction only if it does not exist, under a
  lease of ``ttl`` seconds that this replica keeps alive. Its ``create_revision`` is the term.
- A fenced write is a transaction that also compares the election key's ``create_revision``
  with the writer's term: once another replica has won, the comparison fails and nothing is
  written (:class:`FencedError`), whatever the deposed replica believes.
- A leader stops deciding (``Leadership.lost``) when its keep-alives have failed for 70% of the
  TTL, before etcd can expire the lease and elect anyone else.
- One client per endpoint; a request that cannot reach one endpoint is retried on the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aetcd

from inferway.gateway.fleet.store import (
    ConflictError,
    Fence,
    FencedError,
    Leadership,
    Record,
    StoreHealth,
    StoreUnavailableError,
)

__all__ = ["EtcdStore"]

log = logging.getLogger("inferway.fleet")

_T = TypeVar("_T")
_UNREACHABLE = (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, aetcd.InternalError)
LOSE_AFTER = 0.7
"""Fraction of the lease's TTL after the last confirmed keep-alive at which a leader stops
deciding: etcd cannot expire the lease sooner than the full TTL after that keep-alive."""
POLL_S = 0.1
"""How often a candidate looks at the election key while another replica holds it."""


class EtcdStore:
    def __init__(
        self, endpoints: list[tuple[str, int]], prefix: str = "/inferway", timeout: float = 2.0
    ) -> None:
        if not endpoints:
            raise ValueError("etcd store: no endpoints")
        self.endpoints = endpoints
        self.prefix = prefix.rstrip("/")
        self.timeout = timeout
        self.url = "etcd://" + ",".join(f"{h}:{p}" for h, p in endpoints) + self.prefix
        self._clients: dict[int, aetcd.Client] = {}
        self._current = 0
        self._keepalives: dict[int, asyncio.Task[None]] = {}

    # -- plumbing --------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return f"{self.prefix}/{key.lstrip('/')}".encode()

    def _name(self, raw: bytes) -> str:
        return raw.decode()[len(self.prefix) + 1 :]

    def _client(self, index: int) -> aetcd.Client:
        client = self._clients.get(index)
        if client is None:
            host, port = self.endpoints[index]
            client = aetcd.Client(host=host, port=port, timeout=self.timeout)
            self._clients[index] = client
        return client

    async def _call(self, what: str, request: Callable[[aetcd.Client], Awaitable[_T]]) -> _T:
        """``request`` on the current endpoint, then on each other one, until one answers."""
        errors = []
        for step in range(len(self.endpoints)):
            index = (self._current + step) % len(self.endpoints)
            try:
                async with asyncio.timeout(self.timeout):
                    result = await request(self._client(index))
            except (*_UNREACHABLE, TimeoutError) as exc:
                host, port = self.endpoints[index]
                errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            self._current = index
            return result
        raise StoreUnavailableError(f"etcd {what}: no endpoint answered ({'; '.join(errors)})")

    def _election_key(self, name: str) -> bytes:
        return self._key(f"election/{name}")

    # -- records ---------------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        got = await self._call("get", lambda c: c.get(self._key(key)))
        return None if got is None else Record(key, got.value, got.mod_revision)

    async def list(self, prefix: str) -> list[Record]:
        found = await self._call("list", lambda c: c.get_prefix(self._key(prefix)))
        return [Record(self._name(kv.key), kv.value, kv.mod_revision) for kv in found]

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, fence: Fence | None = None
    ) -> Record:
        raw = self._key(key)

        async def attempt(c: aetcd.Client) -> tuple[bool, list[Any]]:
            t = c.transactions
            compare = []
            if expect is not None:
                compare.append(t.version(raw) == 0 if expect == 0 else t.mod(raw) == expect)
            if fence is not None:
                compare.append(t.create(self._election_key(fence.name)) == fence.term)
            failure = [t.get(raw)] + ([t.get(self._election_key(fence.name))] if fence else [])
            result: tuple[bool, list[Any]] = await c.transaction(
                compare=compare, success=[t.put(raw, value)], failure=failure
            )
            return result

        ok, responses = await self._call("put", attempt)
        if ok:
            return Record(key, value, responses[0].response_put.header.revision)
        found = responses[0][0][1].mod_revision if responses[0] else 0
        if fence is not None:
            term = responses[1][0][1].create_revision if responses[1] else 0
            if term != fence.term:
                raise FencedError(
                    f"{key}: not written, {fence.identity} no longer leads {fence.name!r} "
                    f"(term {fence.term}, now {term or 'none'})"
                )
        raise ConflictError(key, expect or 0, found)

    async def watch(self, prefix: str, *, after: int = 0) -> AsyncIterator[Record]:
        seen = after
        while True:
            try:
                client = self._client(self._current)
                watch = await client.watch_prefix(self._key(prefix), start_revision=seen + 1)
                async for event in watch:
                    if event.kind != aetcd.EventKind.PUT:
                        continue
                    seen = max(seen, event.kv.mod_revision)
                    yield Record(self._name(event.kv.key), event.kv.value, event.kv.mod_revision)
            except _UNREACHABLE as exc:
                log.warning(
                    "etcd watch on %s broke (%s): resuming on the next endpoint", prefix, exc
                )
                self._current = (self._current + 1) % len(self.endpoints)
                await asyncio.sleep(POLL_S)

    # -- election --------------------------------------------------------------------------

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        """Keep trying until this replica leads: while another holds the key, and while etcd
        cannot answer (no quorum, an election of its own), a candidate waits and tries again."""
        seconds = max(2, math.ceil(ttl))
        while True:
            try:
                won = await self._claim(name, identity, seconds)
                if won is not None:
                    return won
                while await self.leader(name) is not None:
                    await asyncio.sleep(POLL_S)
            except StoreUnavailableError as exc:
                log.warning("campaign for %r: %s; trying again", name, exc)
                await asyncio.sleep(POLL_S)

    async def _claim(self, name: str, identity: str, seconds: int) -> Leadership | None:
        key = self._election_key(name)
        sent = time.monotonic()
        lease = await self._call("lease", lambda c: c.lease(seconds))

        async def claim(c: aetcd.Client) -> tuple[bool, list[Any]]:
            t = c.transactions
            result: tuple[bool, list[Any]] = await c.transaction(
                compare=[t.create(key) == 0],
                success=[t.put(key, identity.encode(), lease=lease.id)],
                failure=[t.get(key)],
            )
            return result

        try:
            won, responses = await self._call("campaign", claim)
        except BaseException:
            await self._revoke(lease.id)
            raise
        if not won:
            await self._revoke(lease.id)
            return None
        term = responses[0].response_put.header.revision
        leadership = Leadership(Fence(name, identity, term), float(seconds))
        self._keepalives[lease.id] = asyncio.create_task(
            self._keep_alive(lease.id, leadership, sent), name=f"etcd-lease-{name}"
        )
        log.info("%s leads %r (term %d, lease %ds)", identity, name, term, seconds)
        return leadership

    async def _revoke(self, lease_id: int) -> None:
        with contextlib.suppress(StoreUnavailableError):
            await self._call("revoke", lambda c: c.revoke_lease(lease_id))

    async def _keep_alive(self, lease_id: int, leadership: Leadership, confirmed: float) -> None:
        """Renew the lease every third of its TTL (a tenth while renewals fail) and, apart
        from the renewals, give the leadership up at ``confirmed + LOSE_AFTER * ttl`` unless a
        renewal sent later was confirmed first: a renewal stuck in a dead connection cannot
        keep a leader deciding past its lease."""
        last_ok = [confirmed]

        async def watchdog() -> None:
            while not leadership.lost.is_set():
                remaining = last_ok[0] + LOSE_AFTER * leadership.ttl - time.monotonic()
                if remaining <= 0:
                    leadership.lose(f"lease not renewed for {LOSE_AFTER:.0%} of its TTL")
                    return
                await asyncio.sleep(remaining)

        guard = asyncio.create_task(watchdog(), name=f"etcd-lease-watchdog-{lease_id}")
        pause = leadership.ttl / 3
        try:
            while not leadership.lost.is_set():
                await asyncio.sleep(pause)
                sent = time.monotonic()
                try:
                    reply = await self._call("keep-alive", lambda c: c.refresh_lease(lease_id))
                except StoreUnavailableError as exc:
                    log.warning("etcd lease %x: renewal failed: %s", lease_id, exc)
                    pause = leadership.ttl / 10
                    continue
                if reply is None or reply.TTL <= 0:
                    leadership.lose("the lease expired on etcd")
                    return
                last_ok[0] = max(last_ok[0], sent)
                pause = leadership.ttl / 3
        finally:
            guard.cancel()
            self._keepalives.pop(lease_id, None)

    async def resign(self, leadership: Leadership) -> None:
        key = self._election_key(leadership.fence.name)
        got = await self._call("get", lambda c: c.get(key))
        leadership.lose("resigned")
        if got is not None and got.create_revision == leadership.fence.term:
            await self._revoke(got.lease)

    async def leader(self, name: str) -> str | None:
        got = await self._call("get", lambda c: c.get(self._election_key(name)))
        return None if got is None else bytes(got.value).decode()

    async def health(self) -> StoreHealth:
        members = []
        ok = False
        for index, (host, port) in enumerate(self.endpoints):
            try:
                async with asyncio.timeout(self.timeout):
                    status = await self._client(index).status()
            except (*_UNREACHABLE, TimeoutError) as exc:
                members.append(f"{host}:{port} unreachable ({exc or type(exc).__name__})")
                continue
            has_leader = bool(status.leader)
            ok = ok or has_leader
            members.append(f"{host}:{port} {'ok' if has_leader else 'no raft leader'}")
        detail = "answering" if ok else "no endpoint with a raft leader"
        return StoreHealth(self.url, ok, detail, tuple(members))

    async def close(self) -> None:
        for task in list(self._keepalives.values()):
            task.cancel()
        for index, client in self._clients.items():
            try:  # bounded: aetcd's watcher shutdown waits on a queue a dead stream filled
                async with asyncio.timeout(self.timeout):
                    await client.close()
            except Exception as exc:
                host, port = self.endpoints[index]
                log.warning("etcd %s:%d: closing the client: %r", host, port, exc)
        self._clients.clear()
