"""Keep the endpoints watcher on the file the live policy names.

A policy edit may add, move or drop ``endpoints_file``. The follower is a state source (see
:mod:`inferway.gateway.sources`): before an edit is applied it reads the newly named file
(checked against the edit's services; a missing or bad file refuses the edit, the live policy
and endpoints stay) or, when the edit drops the key, clears the file's endpoints so services
use their inline ones. Once the edit is live it moves the watcher to the new file. With
``--endpoints-file`` the command line decides and policy edits do not move it (the runtime
does not attach a follower then).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from types import MappingProxyType

from inferway.gateway.control_plane import AppliedPolicy, PolicyFollower
from inferway.gateway.endpoints_watcher import EndpointsWatcher, load_initial_endpoints
from inferway.gateway.sources import StateSink
from inferway.policies import Policy
from inferway.policies.endpoints import endpoints_file_path
from inferway.state import State

__all__ = ["EndpointsFollower"]

log = logging.getLogger(__name__)


class EndpointsFollower(PolicyFollower):
    """Owns the endpoints watcher; pass ``f.resolve_state`` among the policy watcher's sources
    and ``plane.add_observer(f)``, then ``await f.start(text)``; ``await f.stop()`` at exit."""

    def __init__(
        self,
        plane: StateSink,
        policy_path: Path,
        path: Path | None,
        *,
        debounce_ms: int = 10,
    ) -> None:
        self._plane = plane
        self._policy_path = policy_path
        self._debounce_ms = debounce_ms
        self.path = path
        """The file being watched (None: the live policy names none)."""
        self.watcher: EndpointsWatcher | None = None
        self._pending: tuple[Path | None, str] | None = None
        self._moves: set[asyncio.Task[None]] = set()

    async def start(self, text: str | None) -> None:
        """Watch the initial file (``text``: its content, already live)."""
        if self.path is not None:
            self.watcher = await self._watch(self.path, text or "")

    async def stop(self) -> None:
        for task in list(self._moves):
            await asyncio.gather(task, return_exceptions=True)
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None

    def resolve_state(self, policy: Policy, state: State) -> State:
        """State source: the endpoints of the file ``policy`` names (raises PolicyError)."""
        path = endpoints_file_path(policy, self._policy_path)
        self._pending = None
        if path == self.path:
            return state
        if path is None:
            self._pending = (None, "")
            return dataclasses.replace(state, endpoints=MappingProxyType({}))
        text, endpoints = load_initial_endpoints(path, [s.name for s in policy.services])
        self._pending = (path, text)
        return dataclasses.replace(state, endpoints=endpoints)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        if self._pending is None:
            return
        path, text = self._pending
        self._pending = None
        log.info(
            "the policy now takes endpoints from %s (was %s)",
            path or "its inline lists",
            self.path or "its inline lists",
        )
        self.path = path
        if self.watcher is not None:
            self.watcher.retired = True
        task = asyncio.get_running_loop().create_task(self._move(path, text))
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)

    def on_refused(self, refusal: object) -> None:
        self._pending = None

    async def _move(self, path: Path | None, text: str) -> None:
        old, self.watcher = self.watcher, None
        if old is not None:
            await old.stop()
        if path is not None and path == self.path:  # not moved again meanwhile
            self.watcher = await self._watch(path, text)

    async def _watch(self, path: Path, text: str) -> EndpointsWatcher:
        watcher = EndpointsWatcher(path, self._plane, debounce_ms=self._debounce_ms)
        watcher.mark_loaded(text)
        await watcher.start()
        return watcher
