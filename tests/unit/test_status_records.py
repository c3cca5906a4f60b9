"""Pure parts of keeping ``status`` true: a reverted edit keeps the live policy's age, watched
file problems are recorded and cleared, disconnected nodes expire, and the rendering shows the
keeper's control-plane restarts, a node's last-seen time and an unreadable file."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.cli.status import render_status
from inferway.gateway.admin import build_status
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.keeper_state import KeeperState, KeeperView, ProcessRecord, write_keeper_state
from inferway.policies import PolicyError, PolicyIssue
from inferway.xds.cache import SnapshotCache
from tests.canary_policy import make_policy


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_reapplying_the_live_policy_after_a_refusal_keeps_its_age_and_clears_pending() -> None:
    clock = Clock()
    plane = ControlPlane(SnapshotCache(), clock=clock)
    plane.apply_policy(make_policy(10), "policy.yaml")
    clock.now = 1010.0
    plane.refuse(PolicyError([PolicyIssue("policy.yaml", 3, 1, "x", "bad")]), "policy.yaml")
    assert plane.refusal_pending
    clock.now = 1020.0
    plane.apply_policy(make_policy(10), "policy.yaml")  # the revert: same snapshot
    assert plane.applied_at == 1000.0 and not plane.refusal_pending
    clock.now = 1030.0
    plane.apply_policy(make_policy(50), "policy.yaml")  # a real change
    assert plane.applied_at == 1030.0


def test_a_refusal_before_any_policy_is_pending() -> None:
    plane = ControlPlane(SnapshotCache(), clock=Clock())
    plane.refuse(ValueError("no"), "policy.yaml")
    assert plane.refusal_pending and plane.current is None


def test_file_problems_keep_their_start_time_and_clear() -> None:
    clock = Clock()
    plane = ControlPlane(SnapshotCache(), clock=clock)
    plane.set_file_problem("/p.yaml", "policy", "the file is missing")
    clock.now = 1005.0
    plane.set_file_problem("/p.yaml", "policy", "the file is missing")
    (problem,) = build_status(plane)["file_problems"]
    assert problem == {
        "file": "/p.yaml",
        "kind": "policy",
        "message": "the file is missing",
        "since": 1000.0,
    }
    plane.set_file_problem("/p.yaml", "policy", None)
    assert build_status(plane)["file_problems"] == []


def test_a_disconnected_node_is_listed_with_last_seen_until_its_ttl_passes() -> None:
    clock = Clock()
    cache = SnapshotCache(clock=clock, disconnected_node_ttl=60.0)
    handle = cache.open_stream(base_pb2.Node(id="envoy-1", cluster="edge"))
    clock.now = 1010.0
    cache.close_stream(handle)
    (node,) = cache.node_status()
    assert not node.connected and node.last_seen == 1010.0
    clock.now = 1069.0
    assert [n.node_id for n in cache.node_status()] == ["envoy-1"]
    clock.now = 1071.0
    assert cache.node_status() == []


def test_render_shows_control_plane_restarts_last_seen_and_file_problems(tmp_path: Path) -> None:
    clock = Clock(2000.0)
    cache = SnapshotCache(clock=clock)
    plane = ControlPlane(cache, clock=clock)
    plane.apply_policy(make_policy(10), "policy.yaml")
    cache.close_stream(cache.open_stream(base_pb2.Node(id="envoy-1", cluster="edge")))
    plane.set_file_problem("/etc/inferway/policy.yaml", "policy", "the file is missing")
    state_file = tmp_path / "keeper-state.json"
    write_keeper_state(
        state_file,
        KeeperState(
            keeper_pid=10,
            envoy_admin_port=15001,
            envoy=ProcessRecord(pid=11, running=True),
            control_plane=ProcessRecord(
                pid=12, running=True, restarts=2, last_exit_code=-9, last_exit_at=1990.0
            ),
        ),
    )
    status = build_status(plane, KeeperView(state_file, envoy_admin_port=1))
    assert status["envoy"]["pid"] == 11 and status["envoy"]["admin_port"] == 15001
    assert status["keeper"]["control_plane"]["restarts"] == 2
    console = Console(width=160, record=True)
    render_status(status, console, now=2030.0)
    text = console.export_text()
    assert "pid 12, restarted 2 time(s), last exit code -9 40s ago" in text
    assert "no (last seen 30s ago)" in text
    assert "policy file /etc/inferway/policy.yaml" in text and "the file is missing" in text


def test_the_keeper_view_is_empty_before_the_keeper_wrote_its_file(tmp_path: Path) -> None:
    view = KeeperView(tmp_path / "absent.json", envoy_admin_port=15001)
    assert view.pid is None and not view.running and view.restarts == 0
    assert view.admin_port == 15001 and view.keeper_status() is None
