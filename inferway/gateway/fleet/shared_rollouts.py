"""Rollout state in the fleet's store: what every replica serves, what only the leader writes.

The rollout driver reads and saves through the same two calls as with the one-node folder
(``load``, ``save``); here they go to a local mirror of the store's ``rollouts/`` records, so
the first push of a replica started with an empty disk already carries the fleet's weights.
The leader's saves are written in order, each with its fence: a deposed leader's write is
refused by the store (and ends its leadership), never applied. Every replica watches the
records and hands a state the leader wrote to its driver, which serves its weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from inferway import background
from inferway.controllers.rollout.state import RolloutState, RolloutStateError
from inferway.gateway.fleet.prefix_watch import PrefixWatch
from inferway.gateway.fleet.store import Fence, FencedError, Record, Store, StoreUnavailableError
from inferway.gateway.rollouts.store import RolloutTarget

__all__ = ["PREFIX", "SharedRolloutStore"]

log = logging.getLogger("inferway.fleet")

PREFIX = "rollouts/"


@dataclass
class _Saved:
    target: RolloutTarget
    state_json: str
    version: int


def _decode(record: Record) -> tuple[RolloutTarget, str]:
    data = json.loads(record.value)
    return RolloutTarget(**data["target"]), json.dumps(data["state"])


class SharedRolloutStore:
    def __init__(self, store: Store, fence: Callable[[], Fence | None]) -> None:
        self.store = store
        self._fence = fence
        self._mirror: dict[str, _Saved] = {}
        self._writes: asyncio.Queue[tuple[str, bytes, Fence | None]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._watch = PrefixWatch(
            store,
            PREFIX,
            self._take_and_tell,
            lambda: self._seen,
            "rollout state watch",
            list_first=False,
        )
        self.on_change: Callable[[str], None] = lambda name: None
        """Called with a rollout's name when another replica's write changed its state."""
        self.fenced: Callable[[str], None] = lambda reason: None
        """Called when the store refused this replica's write: it no longer leads."""
        self._seen = 0
        self._pending: dict[str, int] = {}
        """Writes of ours queued or in flight, per rollout: the watch does not undo them."""

    async def load_all(self) -> None:
        """The store's rollouts into the mirror (before the first push)."""
        for record in await self.store.list(PREFIX):
            self._take(record)

    async def refresh(self) -> None:
        """Read every rollout from the store now and hand the changed ones to the driver: a
        replica elected leader continues from the fleet's latest state, not from a mirror
        whose watch lags (it was cut off, or the last write is still on its way)."""
        for record in await self.store.list(PREFIX):
            name = record.key.removeprefix(PREFIX)
            if self._pending.get(name):  # queued in an earlier term: the store's state wins
                self._pending[name] = 0
                self._mirror.pop(name, None)
            if self._take(record):
                self.on_change(name)

    async def _restore(self, name: str) -> None:
        """After a refused write: the store's state replaces ours (our decision was never the
        fleet's), and the driver serves it again."""
        self._pending[name] = 0
        record = await self.store.get(PREFIX + name)
        if record is None:
            self._mirror.pop(name, None)
            return
        try:
            target, state_json = _decode(record)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("rollout %s: stored state not readable: %s", name, exc)
            return
        self._mirror[name] = _Saved(target, state_json, record.version)
        self.on_change(name)

    def _take(self, record: Record) -> bool:
        self._seen = max(self._seen, record.version)
        name = record.key.removeprefix(PREFIX)
        if self._pending.get(name):
            return False
        known = self._mirror.get(name)
        if known is not None and known.version >= record.version:
            return False
        try:
            target, state_json = _decode(record)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("rollout %s: stored state not readable: %s", name, exc)
            return False
        if known is not None and known.state_json == state_json:
            known.version = record.version
            return False
        self._mirror[name] = _Saved(target, state_json, record.version)
        return True

    # -- the driver's two calls -----------------------------------------------------------

    def load(self, name: str) -> tuple[RolloutTarget, RolloutState] | None:
        saved = self._mirror.get(name)
        if saved is None:
            return None
        try:
            return saved.target, RolloutState.from_json(saved.state_json)
        except (ValueError, KeyError, TypeError) as exc:
            raise RolloutStateError(f"store {PREFIX}{name}: {exc}") from None

    def save(self, target: RolloutTarget, state: RolloutState) -> None:
        state_json = state.to_json()
        known = self._mirror.get(state.name)
        version = known.version if known is not None else 0
        self._mirror[state.name] = _Saved(target, state_json, version)
        body = json.dumps({"target": vars(target), "state": json.loads(state_json)}, sort_keys=True)
        self._pending[state.name] = self._pending.get(state.name, 0) + 1
        self._writes.put_nowait((state.name, body.encode(), self._fence()))

    # -- background: the writer and the watch --------------------------------------------

    def start(self) -> None:
        self._writer = background.start(
            self._write_in_order(), name="rollout state writer", log=log
        )
        self._watch.start()

    async def stop(self) -> None:
        await background.cancel(self._writer)
        self._writer = None
        await self._watch.stop()

    async def _write_in_order(self) -> None:
        while True:
            name, body, fence = await self._writes.get()
            try:
                await self._write(name, body, fence)
            except Exception:  # one state not stored must not stop the writes after it
                log.exception("rollout %s: its state was not stored", name)
            finally:
                self._pending[name] = max(self._pending.get(name, 0) - 1, 0)

    async def _write(self, name: str, body: bytes, fence: Fence | None) -> None:
        """Write one state under the fence it was decided under: a state decided in an
        earlier term (queued while the store was unreachable) is never written in a later
        one, and its refusal does not end a later leadership."""
        if fence is not None and fence != self._fence():
            log.warning(
                "rollout %s: a state of term %d not stored: that term ended", name, fence.term
            )
            with contextlib.suppress(StoreUnavailableError):
                await self._restore(name)
            return
        if fence is None:
            log.warning("rollout %s: state not stored: this replica does not lead", name)
            return
        while True:
            try:
                record = await self.store.put(PREFIX + name, body, fence=fence)
            except FencedError as exc:
                if fence == self._fence():
                    self.fenced(str(exc))
                with contextlib.suppress(StoreUnavailableError):
                    await self._restore(name)
                return
            except StoreUnavailableError as exc:
                log.warning("rollout %s: storing its state: %s; retrying", name, exc)
                await asyncio.sleep(0.2)
                continue
            saved = self._mirror.get(name)
            if saved is not None:
                saved.version = max(saved.version, record.version)
            self._seen = max(self._seen, record.version)
            return

    def _take_and_tell(self, record: Record) -> None:
        if self._take(record):
            self.on_change(record.key.removeprefix(PREFIX))
