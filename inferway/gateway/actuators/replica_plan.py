"""The replica manager's decisions, as pure functions: no processes, sockets or clocks.

What a replica's command line and environment are, which device it gets, how long to wait
before starting it again, and which replicas to stop first when scaling in. The manager
(``replicas.py``) is the thin shell that acts on them.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from inferway.policies.replicas import Backoff, Replicas

__all__ = [
    "ReconcilePlan",
    "ReplicaState",
    "ReplicaStatus",
    "ReplicaView",
    "ServiceReplicasStatus",
    "assign_device",
    "backoff_delay",
    "build_command",
    "build_environment",
    "build_readiness_url",
    "choose_to_stop",
    "failures_after_crash",
    "plan_reconcile",
    "resolve_inferway",
]


class ReplicaState(StrEnum):
    """Where one replica is in its life; only ``READY`` replicas are endpoints (capacity)."""

    WAITING = "waiting"  # backing off before a (re)start
    STARTING = "starting"  # process running, readiness not yet 200
    READY = "ready"  # in the service's endpoints
    DRAINING = "draining"  # out of the endpoints, waiting for Envoy to stop using it
    STOPPING = "stopping"  # SIGTERM sent
    FAILED = "failed"  # gave up after too many consecutive failures


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as ``inferway status`` shows it."""

    service: str
    index: int
    state: ReplicaState
    port: int | None
    grpc_port: int | None
    pid: int | None
    device: str | None
    restarts: int
    failures: int
    """Consecutive failed starts/crashes (reset once the replica stays ready)."""
    last_error: str | None
    retry_in: float | None
    """Seconds until the next start attempt (WAITING only)."""

    def to_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "index": self.index,
            "state": self.state.value,
            "port": self.port,
            "grpc_port": self.grpc_port,
            "pid": self.pid,
            "device": self.device,
            "restarts": self.restarts,
            "failures": self.failures,
            "last_error": self.last_error,
            "retry_in": self.retry_in,
        }


@dataclass(frozen=True)
class ServiceReplicasStatus:
    service: str
    desired: int
    min: int
    max: int
    replicas: tuple[ReplicaStatus, ...]

    @property
    def ready(self) -> int:
        """Capacity: replicas in the endpoints (a never-ready replica does not count)."""
        return sum(1 for r in self.replicas if r.state is ReplicaState.READY)

    def lines(self) -> list[str]:
        """Human status: one line for the service, one per replica."""
        out = [
            f"{self.service}: {self.ready} ready of {self.desired} desired "
            f"(min {self.min}, max {self.max})"
        ]
        for r in self.replicas:
            parts = [f"  [{r.index}] {r.state.value}"]
            if r.port is not None:
                parts.append(f"port {r.port}")
            if r.pid is not None:
                parts.append(f"pid {r.pid}")
            if r.device is not None:
                parts.append(f"device {r.device}")
            parts.append(f"restarts {r.restarts}")
            if r.retry_in is not None:
                parts.append(f"retry in {r.retry_in:.1f}s")
            if r.last_error:
                parts.append(f"last error: {r.last_error}")
            out.append(", ".join(parts))
        return out

    def not_ready(self) -> list[str]:
        """Why fewer than ``desired`` replicas are ready, one line per replica that is not
        (its state, the wait before its next start, its last error: "cannot run 'inferway'",
        an exit code, a readiness timeout); empty when every desired replica is ready."""
        if self.ready >= self.desired:
            return []
        out = []
        for r in self.replicas:
            if r.state is ReplicaState.READY:
                continue
            if r.state is ReplicaState.FAILED:
                line = (
                    f"replica {r.index} failed: given up after {r.failures} failures in a "
                    "row (an edit of its replicas: section tries again)"
                )
            elif r.state is ReplicaState.WAITING:
                retry = "" if r.retry_in is None else f" in {r.retry_in:.1f}s"
                line = f"replica {r.index} waiting to start{retry}"
                if r.failures:
                    line += f" after {r.failures} failure{'s' if r.failures > 1 else ''}"
            elif r.state is ReplicaState.STARTING:
                pid = "" if r.pid is None else f" (pid {r.pid})"
                line = f"replica {r.index} starting{pid}: its readiness check has not passed yet"
            else:
                line = f"replica {r.index} {r.state.value}: being stopped"
            if r.last_error:
                line += f"; last error: {r.last_error}"
            out.append(line)
        missing = self.desired - len(self.replicas)
        if missing > 0:
            out.append(f"{missing} more not started yet")
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "desired": self.desired,
            "ready": self.ready,
            "min": self.min,
            "max": self.max,
            "not_ready": self.not_ready(),
            "replicas": [r.to_json() for r in self.replicas],
        }


def _values(
    spec: Replicas, service: str, index: int, port: int, grpc_port: int, device: str | None
) -> dict[str, object]:
    return {
        "port": port,
        "grpc_port": grpc_port,
        "host": spec.host,
        "index": index,
        "device": device or "",
        "service": service,
    }


def build_command(
    spec: Replicas, service: str, index: int, port: int, grpc_port: int, device: str | None
) -> list[str]:
    """The argv: the template split like a shell would, each word filled in (no shell runs,
    so a filled-in value can never inject a word)."""
    values = _values(spec, service, index, port, grpc_port, device)
    return resolve_inferway([word.format(**values) for word in shlex.split(spec.command)])


def resolve_inferway(argv: list[str]) -> list[str]:
    """A command naming ``inferway`` runs the inferway of this control plane: the script
    beside this interpreter when there is one (a virtual environment, a pip install), else
    this interpreter with ``-m inferway.cli.entry``. By name alone it needs the install's
    bin folder on PATH, which a pip install outside an activated venv does not give, and
    every start would fail with "cannot run 'inferway'"."""
    if not argv or argv[0] != "inferway":
        return argv
    beside = Path(sys.executable).parent / "inferway"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *argv[1:]]
    return [sys.executable, "-m", "inferway.cli.entry", *argv[1:]]


def build_environment(
    spec: Replicas,
    base: Mapping[str, str],
    service: str,
    index: int,
    port: int,
    grpc_port: int,
    device: str | None,
) -> dict[str, str]:
    env = dict(base)
    values = _values(spec, service, index, port, grpc_port, device)
    env.update({k: v.format(**values) for k, v in spec.env.items()})
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


def build_readiness_url(
    spec: Replicas, service: str, index: int, port: int, grpc_port: int, device: str | None
) -> str:
    values = _values(spec, service, index, port, grpc_port, device)
    if spec.readiness.startswith("/"):
        host = f"[{spec.host}]" if ":" in spec.host else spec.host
        return f"http://{host}:{port}{spec.readiness.format(**values)}"
    return spec.readiness.format(**values)


def assign_device(
    devices: Sequence[str] | None, in_use: Collection[str], *, share: bool
) -> str | None:
    """The device for a new replica, given the devices live replicas hold (one entry per
    replica). None without a device list. Raises LookupError when every device is taken
    and sharing is not allowed: two replicas on one accelerator is never silent."""
    if not devices:
        return None
    counts = {d: 0 for d in devices}
    for device in in_use:
        if device in counts:
            counts[device] += 1
    free = [d for d in devices if counts[d] == 0]
    if free:
        return free[0]
    if not share:
        raise LookupError(f"every device is in use ({', '.join(devices)}) and sharing is off")
    return min(devices, key=lambda d: (counts[d], devices.index(d)))


def backoff_delay(backoff: Backoff, failures: int) -> float | None:
    """Seconds to wait before the next start after ``failures`` consecutive failures
    (0 before the first start); None once the replica should be given up on."""
    if failures <= 0:
        return 0.0
    if failures >= backoff.give_up_after:
        return None
    return float(min(backoff.max, backoff.initial * 2 ** (failures - 1)))


def choose_to_stop(replicas: Sequence[tuple[int, ReplicaState]], count: int) -> list[int]:
    """Which ``count`` replicas (index, state) to stop when scaling in: those that are no
    capacity first (failed, waiting, starting), then the ready ones, newest (highest
    index) first, so the longest-serving replicas and their warm caches stay."""
    rank = {
        ReplicaState.FAILED: 0,
        ReplicaState.WAITING: 1,
        ReplicaState.STARTING: 2,
        ReplicaState.READY: 3,
    }
    candidates = [(i, s) for i, s in replicas if s in rank]
    candidates.sort(key=lambda item: (rank[item[1]], -item[0]))
    return [i for i, _ in candidates[: max(0, count)]]


def failures_after_crash(
    failures: int, ready_since: float | None, now: float, stable_after: float
) -> int:
    """The consecutive-failure count after a crash: a replica that served for
    ``stable_after`` seconds starts over at 1 (a fresh, short backoff)."""
    stable = ready_since is not None and now - ready_since >= stable_after
    return 1 if stable else failures + 1


@dataclass(frozen=True)
class ReplicaView:
    """What reconciling needs to know of one replica."""

    index: int
    generation: int
    state: ReplicaState
    device: str | None
    stopping: bool


@dataclass(frozen=True)
class ReconcilePlan:
    start: tuple[str | None, ...] = ()
    """One entry per replica to start: its device (None without a device list)."""
    stop: tuple[tuple[int, str], ...] = ()
    """(index, reason) of each replica to stop."""


def plan_reconcile(
    desired: int,
    generation: int,
    replicas: Sequence[ReplicaView],
    devices: Sequence[str] | None,
    *,
    share: bool,
) -> ReconcilePlan:
    """Start or stop replicas so that ``generation`` (the current spec) has ``desired`` of
    them; retire replicas of older generations once new ones are ready to take over
    (make-before-break), or one at a time when every device is held by an old one."""
    live = [r for r in replicas if not r.stopping]
    current = [r for r in live if r.generation == generation]
    old = [r for r in live if r.generation != generation]
    in_use = [r.device for r in replicas if r.device is not None]
    start: list[str | None] = []
    blocked = False
    for _ in range(desired - len(current)):
        try:
            device = assign_device(devices, in_use, share=share)
        except LookupError:
            blocked = True  # a device frees up when a stopping replica ends
            break
        start.append(device)
        if device is not None:
            in_use.append(device)
    stop: list[tuple[int, str]] = []
    surplus = len(current) - desired
    if surplus > 0:
        chosen = choose_to_stop([(r.index, r.state) for r in current], surplus)
        stop += [(i, "scale in") for i in chosen]
    ready_new = sum(1 for r in current if r.state is ReplicaState.READY)
    replaced = len(old) + min(ready_new, desired) - desired
    if blocked and old and replaced <= 0 and len(live) == len(replicas):
        replaced = 1  # every device is held by an old replica: break before make
    if replaced > 0:
        chosen = choose_to_stop([(r.index, r.state) for r in old], replaced)
        stop += [(i, "replaced") for i in chosen]
    return ReconcilePlan(tuple(start), tuple(stop))
