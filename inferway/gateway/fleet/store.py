"""The small interface every store implements: versioned records, compare-and-set, fenced
writes, watches and an election with a lease.

Controllers never see it: the drivers that run them read and write their state through a
``Store``. A write made on behalf of a leader carries its :class:`Fence`; the store refuses it
(:class:`FencedError`) once another replica has been elected, so a deposed leader that has not
noticed yet still cannot act (etcd: a transaction comparing the election key's create revision;
file: the lock is held by this process).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "ConflictError",
    "Fence",
    "FencedError",
    "Leadership",
    "Record",
    "Store",
    "StoreHealth",
    "StoreUnavailableError",
]


@dataclass(frozen=True, slots=True)
class Record:
    """One key's value and its version: the store's revision of the last write to it (etcd's
    ``mod_revision``; a counter for ``file:``). A missing key has no record."""

    key: str
    value: bytes
    version: int


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of leadership carried by a leader's writes: the election ``name``, the ``identity``
    that won it and the ``term`` (the election key's create revision: a new leader, a new
    term)."""

    name: str
    identity: str
    term: int


@dataclass(slots=True)
class Leadership:
    """Held while ``lost`` is not set. The store sets ``lost`` when it can no longer prove the
    lease is alive (a failed keep-alive past the deadline, a revoked lease), before the lease
    can expire on the store's side: a leader stops deciding before anyone else can start."""

    fence: Fence
    ttl: float
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """For ``status``: the store's URL without credentials, whether it answered, and how."""

    url: str
    ok: bool
    detail: str
    members: tuple[str, ...] = ()


class ConflictError(Exception):
    """A compare-and-set lost: the key's version was not the one expected."""

    def __init__(self, key: str, expected: int, found: int) -> None:
        super().__init__(f"{key}: expected version {expected}, found {found}")
        self.key, self.expected, self.found = key, expected, found


class FencedError(Exception):
    """A write carried a fence that is no longer the election's: this replica was deposed."""


class StoreUnavailableError(Exception):
    """The store could not be reached (or had no quorum) within the request's deadline."""


class Store(Protocol):
    url: str

    async def get(self, key: str) -> Record | None: ...

    async def list(self, prefix: str) -> list[Record]: ...

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, fence: Fence | None = None
    ) -> Record:
        """Write ``value``. ``expect``: the version the key must have (0: it must not exist),
        else :class:`ConflictError`; ``fence``: the leadership the write is made under, else
        :class:`FencedError`. Returns the new record."""
        ...

    def watch(self, prefix: str, *, after: int = 0) -> AsyncIterator[Record]:
        """Every write under ``prefix`` with a version above ``after``, as it happens."""
        ...

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        """Wait until ``identity`` leads the election ``name``; keep its lease alive after."""
        ...

    async def resign(self, leadership: Leadership) -> None: ...

    async def leader(self, name: str) -> str | None:
        """The identity leading ``name`` now, or None."""
        ...

    async def health(self) -> StoreHealth: ...

    async def close(self) -> None: ...
