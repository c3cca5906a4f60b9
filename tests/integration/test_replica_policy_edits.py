"""The replica manager attached to a real ControlPlane, following policy edits with real
processes (no Envoy: the xDS side is covered by test_replica_manager.py): an edited command
replaces replicas make-before-break, removed replicas stop, a command that cannot run is
given up on, and ``scale_to`` clamps to min..max."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from inferway.gateway.actuators.attach import attach_replica_manager
from inferway.gateway.actuators.replica_plan import ReplicaState
from inferway.gateway.actuators.replicas import ReplicaManager, UnknownServiceError
from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.policies import load_policy_text
from inferway.xds.cache import SnapshotCache
from tests.helpers import poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVER = f"{sys.executable} -m tests.replica_server --port {{port}}"


def _policy(replicas: str) -> str:
    return (
        "listeners: [{name: edge, port: 10000}]\n"
        "services:\n"
        "  - name: model\n"
        f"{replicas}"
        "routes:\n"
        "  - name: all\n"
        "    backends: [{service: model}]\n"
    )


def _replicas(command: str, *, min_: int = 1, max_: int = 3, initial: int = 1) -> str:
    return (
        "    replicas:\n"
        f"      command: {command}\n"
        f"      min: {min_}\n"
        f"      max: {max_}\n"
        f"      initial: {initial}\n"
        "      drain_timeout: 5s\n"
        "      backoff: {initial: 50ms, max: 100ms, give_up_after: 3}\n"
    )


class _ReplicaCounts(PolicyFollower):
    """Observer: the number of ready replicas in State at each applied snapshot."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = control_plane
        self.counts: list[int] = []

    def on_applied(self, _applied: AppliedPolicy, _changed: bool) -> None:
        self.counts.append(len(self.control_plane.state.replicas.get("model", ())))


@asynccontextmanager
async def managed(
    policy: str, tmp_path: Path
) -> AsyncIterator[tuple[ControlPlane, ReplicaManager]]:
    control_plane = ControlPlane(SnapshotCache())
    control_plane.apply_policy(load_policy_text(policy), "policy.yaml")
    manager = attach_replica_manager(
        control_plane,
        probe_interval=0.05,
        workdir=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        log_dir=tmp_path,
    )
    try:
        yield control_plane, manager
    finally:
        await manager.close()


def _ready_ports(manager: ReplicaManager) -> set[int]:
    return {
        r.port
        for s in manager.status()
        for r in s.replicas
        if r.state is ReplicaState.READY and r.port
    }


async def test_an_edited_command_replaces_the_replicas_make_before_break(tmp_path: Path) -> None:
    before = _policy(_replicas(SERVER, initial=2))
    async with managed(before, tmp_path) as (control_plane, manager):
        await poll_until(
            lambda: len(control_plane.state.replicas.get("model", ())) == 2,
            timeout=20,
            what="2 ready replicas in State",
        )
        old = _ready_ports(manager)
        counts = _ReplicaCounts(control_plane)
        control_plane.add_observer(counts)

        control_plane.apply_policy(
            load_policy_text(_policy(_replicas(f"{SERVER} --delay 0.01", initial=2))), "edit"
        )

        def replaced() -> bool:
            listed = {e.port for e in control_plane.state.replicas.get("model", ())}
            return len(listed) == 2 and not listed & old and len(manager.status()[0].replicas) == 2

        await poll_until(replaced, timeout=30, what="both replicas replaced")
        assert min(counts.counts) >= 2, counts.counts  # never below the desired count
        reasons = [e.detail.get("reason") for e in manager.events if e.kind == "stop_requested"]
        assert reasons == ["replaced", "replaced"]


async def test_replicas_removed_from_the_policy_are_stopped(tmp_path: Path) -> None:
    async with managed(_policy(_replicas(SERVER)), tmp_path) as (control_plane, manager):
        await poll_until(lambda: len(_ready_ports(manager)) == 1, timeout=20, what="ready")
        pid = manager.status()[0].replicas[0].pid
        assert pid is not None
        control_plane.apply_policy(
            load_policy_text(_policy("    endpoints: ['127.0.0.1:9']\n")), "edit"
        )
        await poll_until(lambda: manager.status() == (), timeout=20, what="replicas stopped")
        assert control_plane.state.replicas == {}
        assert [e.port for e in control_plane.policy.services[0].endpoints] == [9]  # type: ignore[union-attr]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_command_that_cannot_run_is_given_up_until_an_edit(tmp_path: Path) -> None:
    command = str(tmp_path / "no-such-server") + " --port {port}"
    async with managed(_policy(_replicas(command)), tmp_path) as (control_plane, manager):
        await poll_until(
            lambda: manager.status()[0].replicas[0].state is ReplicaState.FAILED,
            timeout=10,
            what="given up",
        )
        (replica,) = manager.status()[0].replicas
        assert replica.failures == 3 and replica.last_error is not None
        assert "cannot run" in replica.last_error and "no-such-server" in replica.last_error
        assert [e.kind for e in manager.events].count("spawn_failed") == 3
        assert control_plane.state.replicas.get("model", ()) == ()

        edited = _replicas(command).replace("give_up_after: 3", "give_up_after: 2")
        control_plane.apply_policy(load_policy_text(_policy(edited)), "edit")

        def failed_again() -> bool:
            kinds = [e.kind for e in manager.events]
            return kinds.count("gave_up") == 2 and kinds.count("spawn_failed") == 5

        await poll_until(failed_again, timeout=10, what="an edit to try again, twice")
        assert manager.status()[0].replicas[0].state is ReplicaState.FAILED


async def test_scale_to_clamps_to_min_and_max_and_refuses_unknown_services(tmp_path: Path) -> None:
    command = str(tmp_path / "no-such-server") + " --port {port}"
    async with managed(_policy(_replicas(command, min_=1, max_=2)), tmp_path) as (_, manager):
        assert manager.scale_to("model", 10, reason="test") == 2
        assert manager.scale_to("model", 0) == 1
        scaled = [e for e in manager.events if e.kind == "scaled"]
        assert [(e.detail["requested"], e.detail["desired"]) for e in scaled] == [(10, 2), (0, 1)]
        with pytest.raises(UnknownServiceError, match=r"service 'other' has no replicas.*model"):
            manager.scale_to("other", 1)
