"""One service's replicas: each a task that starts its process, waits for readiness, and
on stop drains it make-before-break.

A replica's life: WAITING (backoff) -> STARTING (process up, readiness polled) -> READY
(an endpoint) -> DRAINING (out of the endpoints; Envoy asked until it no longer routes to
it, or the drain timeout) -> STOPPING (SIGTERM, SIGKILL after the grace). A crash or a
replica not ready in time goes back to WAITING with a longer backoff, and to FAILED after
too many in a row: reported, never counted as capacity, never respawned in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from inferway import background
from inferway.free_ports import free_ports
from inferway.gateway.actuators.replica_plan import (
    ReplicaState,
    ReplicaStatus,
    ReplicaView,
    ServiceReplicasStatus,
    backoff_delay,
    build_command,
    build_environment,
    build_readiness_url,
    failures_after_crash,
    plan_reconcile,
)
from inferway.gateway.actuators.replica_process import (
    ReplicaProcess,
    probe_ready,
    spawn_replica,
)
from inferway.policies.model import Endpoint
from inferway.policies.replicas import Replicas

__all__ = ["DrainProbe", "ReplicaContext", "ReplicaSet"]

log = logging.getLogger(__name__)

DrainProbe = Callable[[str, str, int], Awaitable[bool]]
"""``await probe(service, host, port)``: True once Envoy no longer routes to that host."""

Emit = Callable[..., None]
"""``emit(kind, service, index, **detail)``: one structured event."""


@dataclass
class ReplicaContext:
    """What every replica set shares, given by the manager."""

    session: aiohttp.ClientSession
    emit: Emit
    changed: Callable[[], None]
    """A replica entered or left READY, or a replica ended: publish and reconcile."""
    drain_probe: DrainProbe | None
    clock: Callable[[], float]
    log_dir: Path
    workdir: str | None
    base_env: Mapping[str, str]
    probe_interval: float = 0.2


@dataclass(eq=False)
class _Replica:
    index: int
    generation: int
    spec: Replicas
    device: str | None
    state: ReplicaState = ReplicaState.WAITING
    port: int | None = None
    grpc_port: int | None = None
    process: ReplicaProcess | None = None
    starts: int = 0
    failures: int = 0
    last_error: str | None = None
    retry_at: float | None = None
    ready_since: float | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class ReplicaSet:
    """The replicas of one service, kept at ``desired`` (within the spec's min..max)."""

    def __init__(self, service: str, spec: Replicas, context: ReplicaContext) -> None:
        self.service = service
        self.spec = spec
        self.desired = spec.start_count
        self._ctx = context
        self._generation = 0
        self._replicas: dict[int, _Replica] = {}
        self.retired = False

    # -- what the manager asks -------------------------------------------------------------

    def update(self, spec: Replicas) -> None:
        """A new spec from an edited policy. A change to how replicas are run (command,
        environment, devices, ...) replaces them make-before-break; a change of counts only
        clamps ``desired``."""
        if spec == self.spec:
            return
        counts = ("min", "max", "initial", "drain_timeout", "stop_grace", "backoff")
        if spec.model_dump(exclude=set(counts)) != self.spec.model_dump(exclude=set(counts)):
            self._generation += 1
        self.spec = spec
        self.desired = min(max(self.desired, spec.min), spec.max)
        for replica in list(self._replicas.values()):
            if replica.state is ReplicaState.FAILED and not replica.stop.is_set():
                self._stop(replica.index, "edited: try again")  # a fresh one replaces it
        self.reconcile()

    def scale_to(self, count: int) -> int:
        """Set the desired count, clamped to min..max; returns what was set."""
        self.desired = min(max(count, self.spec.min), self.spec.max)
        self.reconcile()
        return self.desired

    def retire(self) -> None:
        """The service (or its ``replicas:``) left the policy: stop every replica."""
        self.retired = True
        self.desired = 0
        self.reconcile()

    @property
    def finished(self) -> bool:
        return self.retired and not self._replicas

    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(
            Endpoint(host=r.spec.host, port=r.port)
            for r in sorted(self._replicas.values(), key=lambda r: r.index)
            if r.state is ReplicaState.READY and r.port is not None
        )

    def status(self) -> ServiceReplicasStatus:
        now = self._ctx.clock()
        return ServiceReplicasStatus(
            service=self.service,
            desired=self.desired,
            min=self.spec.min,
            max=self.spec.max,
            replicas=tuple(
                ReplicaStatus(
                    service=self.service,
                    index=r.index,
                    state=r.state,
                    port=r.port,
                    grpc_port=r.grpc_port,
                    pid=r.process.pid if r.process and r.process.returncode is None else None,
                    device=r.device,
                    restarts=max(0, r.starts - 1),
                    failures=r.failures,
                    last_error=r.last_error,
                    retry_in=None if r.retry_at is None else max(0.0, r.retry_at - now),
                )
                for r in sorted(self._replicas.values(), key=lambda r: r.index)
            ),
        )

    async def close(self) -> None:
        """Stop every replica (draining the ready ones) and wait until they are gone."""
        self.retire()
        tasks = [r.task for r in self._replicas.values() if r.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- keeping the count -----------------------------------------------------------------

    def reconcile(self) -> None:
        """Act on :func:`plan_reconcile` for the replicas as they are now."""
        views = [
            ReplicaView(r.index, r.generation, r.state, r.device, r.stop.is_set())
            for r in self._replicas.values()
        ]
        plan = plan_reconcile(
            self.desired,
            self._generation,
            views,
            self.spec.devices,
            share=self.spec.share_devices,
        )
        for device in plan.start:
            self._start(device)
        for index, reason in plan.stop:
            self._stop(index, reason)

    def _start(self, device: str | None) -> None:
        index = next(i for i in range(len(self._replicas) + 1) if i not in self._replicas)
        replica = _Replica(index, self._generation, self.spec, device)
        self._replicas[index] = replica
        replica.task = background.start(
            self._life(replica), name=f"replica {self.service}[{index}]", log=log
        )

    def _stop(self, index: int, reason: str) -> None:
        replica = self._replicas[index]
        self._emit("stop_requested", replica, reason=reason, state=replica.state.value)
        replica.stop.set()

    def _emit(self, kind: str, replica: _Replica, **detail: object) -> None:
        self._ctx.emit(kind, self.service, replica.index, **detail)

    # -- one replica's life ----------------------------------------------------------------

    async def _life(self, replica: _Replica) -> None:
        try:
            while not replica.stop.is_set():
                delay = backoff_delay(replica.spec.backoff, replica.failures)
                if delay is None:
                    replica.state = ReplicaState.FAILED
                    self._emit("gave_up", replica, failures=replica.failures)
                    await replica.stop.wait()
                    break
                if delay > 0:
                    replica.state = ReplicaState.WAITING
                    replica.retry_at = self._ctx.clock() + delay
                    self._emit("backoff", replica, seconds=delay, failures=replica.failures)
                    if await self._stopped_within(replica, delay):
                        break
                replica.retry_at = None
                try:
                    await self._attempt(replica)
                except Exception as error:  # counted like a crash: backoff, then give up
                    await self._recover(replica, error)
        finally:
            await self._shutdown(replica)
            self._replicas.pop(replica.index, None)
            self._ctx.changed()

    async def _attempt(self, replica: _Replica) -> None:
        """One start: spawn, wait for readiness, serve until the process exits or a stop."""
        if not await self._spawn(replica):
            return
        if not await self._until_ready(replica):
            return
        assert replica.process is not None
        replica.state = ReplicaState.READY
        replica.ready_since = self._ctx.clock()
        self._emit("ready", replica, port=replica.port, pid=replica.process.pid)
        self._ctx.changed()
        await self._until_exit_or_stop(replica)

    async def _recover(self, replica: _Replica, error: Exception) -> None:
        log.exception("replica %s[%d] failed unexpectedly", self.service, replica.index)
        if replica.stop.is_set():
            return  # the shutdown that follows drains and stops it
        if replica.state is ReplicaState.READY:
            replica.state = ReplicaState.WAITING
            self._ctx.changed()
        if replica.process is not None and replica.process.returncode is None:
            await replica.process.terminate(replica.spec.stop_grace)
        self._fail(replica, "error", f"{type(error).__name__}: {error}")

    async def _stopped_within(self, replica: _Replica, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await replica.stop.wait()
        return replica.stop.is_set()

    def _fail(self, replica: _Replica, kind: str, error: str) -> None:
        replica.failures += 1
        replica.last_error = error
        self._emit(kind, replica, error=error, failures=replica.failures)

    async def _spawn(self, replica: _Replica) -> bool:
        spec = replica.spec
        try:
            replica.port, replica.grpc_port = free_ports(spec.host, spec.host)
        except OSError as error:
            self._fail(replica, "spawn_failed", f"no free port on {spec.host}: {error}")
            return False
        args = (spec, self.service, replica.index, replica.port, replica.grpc_port)
        argv = build_command(*args, replica.device)
        env = build_environment(spec, self._ctx.base_env, *args[1:], replica.device)
        log_path = self._ctx.log_dir / f"{self.service}-{replica.index}.log"
        replica.state = ReplicaState.STARTING
        replica.starts += 1
        try:
            replica.process = await spawn_replica(
                argv, env, spec.cwd or self._ctx.workdir, log_path
            )
        except OSError as error:
            replica.process = None
            self._fail(replica, "spawn_failed", f"cannot run {argv[0]!r}: {error}")
            return False
        self._emit(
            "started",
            replica,
            pid=replica.process.pid,
            port=replica.port,
            grpc_port=replica.grpc_port,
            device=replica.device,
            argv=argv,
            log=str(log_path),
        )
        return True

    async def _until_ready(self, replica: _Replica) -> bool:
        """Poll readiness until 200 (True), the process exits, the timeout passes or a stop
        is asked for (False; the process is stopped unless a stop was asked for, in which
        case the caller's shutdown does it)."""
        process = replica.process
        assert process is not None and replica.port is not None and replica.grpc_port is not None
        spec = replica.spec
        url = build_readiness_url(
            spec, self.service, replica.index, replica.port, replica.grpc_port, replica.device
        )
        deadline = self._ctx.clock() + spec.ready_timeout
        while not replica.stop.is_set():
            if process.returncode is not None:
                code = process.returncode
                self._fail(
                    replica, "start_failed", f"exited ({code}) before ready: {process.tail()}"
                )
                return False
            if await probe_ready(self._ctx.session, url):
                return True
            if self._ctx.clock() >= deadline:
                error = f"not ready after {spec.ready_timeout:g}s ({url})"
                self._fail(replica, "never_ready", error)
                await process.terminate(spec.stop_grace)
                return False
            await self._stopped_within(replica, self._ctx.probe_interval)
        return False

    async def _until_exit_or_stop(self, replica: _Replica) -> None:
        process = replica.process
        assert process is not None
        exited = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(replica.stop.wait())
        try:
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            exited.cancel()
        if replica.stop.is_set() and process.returncode is None:
            return
        code = process.returncode
        replica.state = ReplicaState.WAITING
        self._ctx.changed()  # out of the endpoints at once
        replica.failures = failures_after_crash(
            replica.failures, replica.ready_since, self._ctx.clock(), replica.spec.stable_after
        )
        replica.last_error = f"exited ({code}) while ready: {process.tail()}"
        self._emit("crashed", replica, error=replica.last_error, failures=replica.failures)

    async def _shutdown(self, replica: _Replica) -> None:
        """Make-before-break: out of the endpoints, drained, then SIGTERM, then SIGKILL."""
        spec = replica.spec
        process = replica.process
        if replica.state is ReplicaState.READY and replica.port is not None:
            replica.state = ReplicaState.DRAINING
            self._ctx.changed()
            began = self._ctx.clock()
            drained = await self._drain(spec, replica.port)
            waited = round(self._ctx.clock() - began, 3)
            kind = "drained" if drained else "drain_timeout"
            if self._ctx.drain_probe is None:
                kind = "drain_waited"  # nobody to ask: the whole drain_timeout was waited
            self._emit(kind, replica, port=replica.port, waited=waited)
        if process is not None and process.returncode is None:
            replica.state = ReplicaState.STOPPING
            code = await process.terminate(spec.stop_grace)
            self._emit("stopped", replica, pid=process.pid, code=code, killed=code == -9)

    async def _drain(self, spec: Replicas, port: int) -> bool:
        deadline = self._ctx.clock() + spec.drain_timeout
        probe = self._ctx.drain_probe
        while True:
            if probe is not None and await self._probe(probe, spec.host, port):
                return True
            remaining = deadline - self._ctx.clock()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(self._ctx.probe_interval, remaining))

    async def _probe(self, probe: DrainProbe, host: str, port: int) -> bool:
        try:
            return await probe(self.service, host, port)
        except Exception:  # an unanswerable probe is "not drained": the timeout bounds it
            log.exception("drain probe for %s %s:%d failed", self.service, host, port)
            return False
