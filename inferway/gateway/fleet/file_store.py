"""``file:PATH``: the one-node store, a folder on the local disk (the default: today's
behaviour, nothing to run).

Records are JSON files written atomically (a temporary file renamed over the old one), each
with its version; a counter file keeps versions increasing across restarts. The election is an
exclusive ``flock`` on a lock file: the process that holds it leads, the kernel releases it
when that process dies, so two gateways pointed at the same folder never both decide.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from inferway.gateway.fleet.store import (
    ConflictError,
    Fence,
    FencedError,
    Leadership,
    Record,
    StoreHealth,
)

__all__ = ["FileStore"]

POLL_S = 0.1
"""How often a watch or a waiting candidate looks at the folder."""


def _quote(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".json"


class FileStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = f"file:{self.root}"
        self._records = self.root / "records"
        self._records.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, IO[bytes]] = {}
        self._terms: dict[str, int] = {}

    def _read(self, path: Path) -> Record | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return Record(data["key"], base64.b64decode(data["value"]), int(data["version"]))

    def _next_version(self) -> int:
        counter = self.root / "revision"
        try:
            current = int(counter.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            current = 0
        _atomic_write(counter, str(current + 1))
        return current + 1

    async def get(self, key: str) -> Record | None:
        return self._read(self._records / _quote(key))

    async def list(self, prefix: str) -> list[Record]:
        found = (self._read(p) for p in self._records.glob("*.json"))
        return sorted(
            (r for r in found if r is not None and r.key.startswith(prefix)), key=lambda r: r.key
        )

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, fence: Fence | None = None
    ) -> Record:
        if fence is not None and self._terms.get(fence.name) != fence.term:
            raise FencedError(f"{key}: not written, this process does not lead {fence.name!r}")
        path = self._records / _quote(key)
        current = self._read(path)
        found = current.version if current else 0
        if expect is not None and found != expect:
            raise ConflictError(key, expect, found)
        record = Record(key, value, self._next_version())
        text = json.dumps(
            {"key": key, "value": base64.b64encode(value).decode(), "version": record.version}
        )
        _atomic_write(path, text)
        return record

    async def watch(self, prefix: str, *, after: int = 0) -> AsyncIterator[Record]:
        seen = after
        while True:
            fresh = sorted(
                (r for r in await self.list(prefix) if r.version > seen), key=lambda r: r.version
            )
            for record in fresh:
                seen = record.version
                yield record
            await asyncio.sleep(POLL_S)

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        lock = (self.root / f"{name}.lock").open("a+b")
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(POLL_S)
        lock.seek(0)
        lock.truncate()
        lock.write(identity.encode())
        lock.flush()
        self._locks[name] = lock
        term = self._next_version()
        self._terms[name] = term
        return Leadership(Fence(name, identity, term), ttl)

    async def resign(self, leadership: Leadership) -> None:
        name = leadership.fence.name
        leadership.lose("resigned")
        self._terms.pop(name, None)
        lock = self._locks.pop(name, None)
        if lock is not None:
            lock.truncate(0)
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()

    async def leader(self, name: str) -> str | None:
        """Whoever holds the lock (a lock taken through another open file, even in this
        process, conflicts with a shared probe), by the identity it wrote."""
        path = self.root / f"{name}.lock"
        try:
            with path.open("rb") as probe:
                try:
                    fcntl.flock(probe.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return probe.read().decode() or None
                fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
                return None
        except FileNotFoundError:
            return None

    async def health(self) -> StoreHealth:
        ok = os.access(self.root, os.W_OK)
        return StoreHealth(self.url, ok, "writable" if ok else f"{self.root} is not writable")

    async def close(self) -> None:
        for lock in self._locks.values():
            lock.close()
        self._locks.clear()
        self._terms.clear()


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
