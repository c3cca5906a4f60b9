"""The replica manager: runs the processes behind every service with ``replicas:`` and
publishes the ready ones as a State source.

It knows nothing of the control plane: it is given a ``sink`` that receives, each time the
set of ready replicas changes, the whole ``{service: endpoints}`` mapping for
``State.replicas`` (``attach.py`` binds that to a ControlPlane). ``scale_to`` is what the
autoscaler calls; ``status()`` is what ``inferway status`` shows; every action is a
structured event, logged and kept (the last ``keep_events``) for status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import aiohttp

from inferway.gateway.actuators.replica_plan import ServiceReplicasStatus
from inferway.gateway.actuators.replica_set import DrainProbe, ReplicaContext, ReplicaSet
from inferway.gateway.admin_documents import ReplicasDocument
from inferway.policies.model import Endpoint, Policy
from inferway.state.model import ServiceEndpoints

__all__ = ["ReplicaEvent", "ReplicaManager", "ReplicaSink", "UnknownServiceError"]

log = logging.getLogger(__name__)

ReplicaSink = Callable[[ServiceEndpoints], None]
"""Receives ``{service: ready endpoints}`` (every managed service) when it changes."""


class UnknownServiceError(LookupError):
    """``scale_to`` named a service that has no ``replicas:`` in the live policy."""


@dataclass(frozen=True)
class ReplicaEvent:
    """One action or observation of the manager, e.g. kind "ready", "crashed",
    "never_ready", "drained", "stopped", "scaled"."""

    at: float  # wall-clock seconds
    service: str
    index: int | None
    kind: str
    detail: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "service": self.service,
            "index": self.index,
            "kind": self.kind,
            **dict(self.detail),
        }


FAILURE_KINDS = frozenset({"spawn_failed", "start_failed", "never_ready", "gave_up"})
"""Events that say a replica could not be started: logged at ERROR, with the reason."""


class ReplicaManager:
    """Replica sets for the services of the live policy. Use from within the event loop;
    ``close()`` stops every replica (and closes the drain probe, if it has ``close``)."""

    def __init__(
        self,
        sink: ReplicaSink,
        *,
        drain_probe: DrainProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        log_dir: str | Path | None = None,
        workdir: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        probe_interval: float = 0.2,
        keep_events: int = 256,
    ) -> None:
        self._sink = sink
        self._drain_probe = drain_probe
        self._clock = clock
        self._wall_clock = wall_clock
        self._log_dir = (
            Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="inferway-replicas-"))
        )
        self._workdir = str(workdir) if workdir is not None else None
        self._env = dict(os.environ if env is None else env)
        self._probe_interval = probe_interval
        self._sets: dict[str, ReplicaSet] = {}
        self._events: deque[ReplicaEvent] = deque(maxlen=keep_events)
        # State starts with no replicas: nothing to publish until a set has some
        self._published: dict[str, tuple[Endpoint, ...]] = {}
        self._flush_scheduled = False
        self._context: ReplicaContext | None = None
        self._closed = False

    # -- the interface -----------------------------------------------------------------------

    def configure(self, policy: Policy) -> None:
        """Follow ``policy``: start sets for new services with ``replicas:`` (at start or by
        a later edit), update changed ones, retire the rest. Idempotent; never publishes
        synchronously (it is called from the control plane's own apply). After ``close()``
        it does nothing: the last publish re-applies the policy, which must not start
        replicas again."""
        if self._closed:
            return
        wanted = {s.name: s.replicas for s in policy.services if s.replicas is not None}
        if not wanted and not self._sets:
            return  # nothing to run (yet): no session, no publish
        context = self._ensure_context()
        for name, spec in wanted.items():
            current = self._sets.get(name)
            if current is None or current.retired:
                if current is not None:  # back before the old set finished stopping
                    current.update(spec)
                    current.retired = False
                    current.desired = spec.start_count
                    current.reconcile()
                else:
                    self._sets[name] = ReplicaSet(name, spec, context)
                    self._emit("configured", name, None, desired=spec.start_count)
                    self._sets[name].reconcile()
            elif current.spec != spec:
                current.update(spec)
                self._emit("reconfigured", name, None, desired=current.desired)
        for name, current in self._sets.items():
            if name not in wanted and not current.retired:
                self._emit("retired", name, None)
                current.retire()
        self._schedule_flush()

    def scale_to(self, service: str, count: int, reason: str = "") -> int:
        """Ask for ``count`` replicas of ``service`` (clamped to its min..max); returns the
        count set. Raises UnknownServiceError for a service without ``replicas:``."""
        current = self._sets.get(service)
        if current is None or current.retired:
            known = ", ".join(sorted(n for n, s in self._sets.items() if not s.retired))
            raise UnknownServiceError(
                f"service '{service}' has no replicas to scale; managed: {known or '(none)'}"
            )
        before = current.desired
        after = current.scale_to(count)
        self._emit(
            "scaled", service, None, requested=count, before=before, desired=after, reason=reason
        )
        self._schedule_flush()
        return after

    def status(self) -> tuple[ServiceReplicasStatus, ...]:
        return tuple(self._sets[name].status() for name in sorted(self._sets))

    def status_json(self) -> ReplicasDocument:
        """What ``inferway status`` prints: per service and replica, plus recent events."""
        return ReplicasDocument(
            services=[s.to_json() for s in self.status()],
            events=[e.to_json() for e in self._events],
        )

    def running_pids(self, service: str) -> list[int]:
        """``service``'s live replica processes' pids in index order (``POST /profile``);
        KeyError when this manager runs no replicas of it."""
        current = self._sets.get(service)
        if current is None or current.retired:
            raise KeyError(service)
        return [r.pid for r in current.status().replicas if r.pid is not None]

    @property
    def events(self) -> tuple[ReplicaEvent, ...]:
        return tuple(self._events)

    def endpoints(self) -> dict[str, tuple[Endpoint, ...]]:
        """Ready replicas per managed service: what the sink last received or will next."""
        return {name: s.endpoints() for name, s in sorted(self._sets.items()) if not s.finished}

    async def close(self) -> None:
        """Drain and stop every replica; then the sink hears that none is left."""
        self._closed = True
        await asyncio.gather(*(s.close() for s in list(self._sets.values())))
        self._flush()
        close = getattr(self._drain_probe, "close", None)
        if close is not None:
            await close()
        if self._context is not None:
            await self._context.session.close()
            self._context = None

    # -- inside --------------------------------------------------------------------------

    def _ensure_context(self) -> ReplicaContext:
        if self._context is None:
            self._context = ReplicaContext(
                session=aiohttp.ClientSession(),
                emit=self._emit,
                changed=self._schedule_flush,
                drain_probe=self._drain_probe,
                clock=self._clock,
                log_dir=self._log_dir,
                workdir=self._workdir,
                base_env=MappingProxyType(self._env),
                probe_interval=self._probe_interval,
            )
        return self._context

    def _emit(self, kind: str, service: str, index: int | None, **detail: object) -> None:
        event = ReplicaEvent(self._wall_clock(), service, index, kind, MappingProxyType(detail))
        self._events.append(event)
        level = logging.ERROR if kind in FAILURE_KINDS else logging.INFO
        words = " ".join(f"{k}={v}" for k, v in sorted(detail.items()) if k != "error")
        error = detail.get("error")
        where = service if index is None else f"{service}[{index}]"
        log.log(
            level,
            "replica %s %s%s%s",
            where,
            kind,
            f": {error}" if error else "",
            f" ({words})" if words else "",
        )

    def _schedule_flush(self) -> None:
        """Coalesce changes into one publish on the next loop turn: the sink may apply a
        snapshot, which may call ``configure`` again; never re-entrantly."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for current in list(self._sets.values()):
            current.reconcile()
        for name in [n for n, s in self._sets.items() if s.finished]:
            del self._sets[name]
        endpoints = self.endpoints()
        if endpoints == self._published:
            return
        self._published = endpoints
        try:
            self._sink(MappingProxyType(endpoints))
        except Exception:  # a refused State must not stop the replicas' lives
            log.exception("replica manager: publishing endpoints failed")
