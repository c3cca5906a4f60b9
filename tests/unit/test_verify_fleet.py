"""verify against a fleet, the pure parts: the Envoys the control plane's status documents
name (one per node, proxyless clients left out), which are checked, where each is reached,
which split each must show, and a verdict that names the Envoy that failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from inferway.cli.main import app
from inferway.tools.verify.fleet import (
    EnvoyTarget,
    FleetSelectionError,
    envoy_overrides,
    envoy_targets,
    fleet_document,
    gateway_url,
    select_targets,
)
from inferway.tools.verify.fleet_report import render_fleet

ROUTES = {"edge": {"models": {"v1": 10.0, "v2": 90.0}}}


def _node(node_id: str, group: str, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "node_id": node_id,
        "group": group,
        "connected": True,
        "in_sync": True,
        "acked": {"routes": "r7"},
        "snapshot_version": "s7",
        "address": "10.0.0.2",
        "address_source": "ads-peer",
    }
    return record | extra


def _target(node: str = "a", **extra: Any) -> EnvoyTarget:
    fields: dict[str, Any] = {
        "node": node,
        "group": "zone:/zone-a",
        "address": "10.0.0.2",
        "address_source": "advertised",
        "connected": True,
        "in_sync": True,
        "acked_routes": "r7",
        "served_version": "s7",
        "replica": "http://cp:15000",
        "routes": ROUTES,
    }
    return EnvoyTarget(**(fields | extra))


def test_targets_merge_every_replicas_nodes_and_prefer_the_connected_record() -> None:
    r1 = {
        "nodes": [
            _node("edge-a", "zone:/zone-a"),
            _node("edge-b", "zone:/zone-b", connected=False),
            _node("grpc-client", "grpc"),
        ],
        "served_weights": {"zone:/zone-a": {"version": "s7", "routes": ROUTES}},
    }
    r2 = {
        "nodes": [_node("edge-b", "zone:eu/zone-b", address="10.0.0.3")],
        "served_weights": {"zone:eu/zone-b": {"version": "s8", "routes": {}}},
    }
    targets = envoy_targets([("http://r1", r1), ("http://r2", r2)])
    assert [t.node for t in targets] == ["edge-a", "edge-b"]
    a, b = targets
    assert (a.zone, a.replica, a.routes, a.acked_routes) == ("zone-a", "http://r1", ROUTES, "r7")
    assert (b.zone, b.replica, b.address, b.connected) == (
        "eu/zone-b",
        "http://r2",
        "10.0.0.3",
        True,
    )


def test_every_connected_envoy_is_checked_and_a_gone_one_is_left_out() -> None:
    gone = _target("c", connected=False)
    chosen, skipped = select_targets([_target("a"), _target("b"), gone], None)
    assert [t.node for t in chosen] == ["a", "b"]
    assert skipped == [gone]


def test_a_named_envoy_must_be_known_and_connected() -> None:
    targets = [_target("a"), _target("b", connected=False)]
    assert select_targets(targets, "a") == ([targets[0]], [])
    with pytest.raises(FleetSelectionError, match=r"no such Envoy \(known: a, b\)"):
        select_targets(targets, "zz")
    with pytest.raises(FleetSelectionError, match="not connected"):
        select_targets(targets, "b")
    with pytest.raises(FleetSelectionError, match="no connected Envoy"):
        select_targets([targets[1]], None)


def test_each_envoy_is_reached_at_its_own_address_and_unknown_ones_are_refused() -> None:
    assert gateway_url(_target(), 10000) == "http://10.0.0.2:10000"
    assert gateway_url(_target(address="fd00::2"), 80) == "http://[fd00::2]:80"
    assert gateway_url(_target(address="gw-1.example"), 80) == "http://gw-1.example:80"
    with pytest.raises(ValueError, match="Envoy a: its listener address is unknown"):
        gateway_url(_target(address=""), 80)
    with pytest.raises(ValueError, match=r"0\.0\.0\.0 \(advertised\) is a wildcard"):
        gateway_url(_target(address="0.0.0.0"), 80)


def test_overrides_are_the_split_the_envoys_group_is_served() -> None:
    backends = {"models": ["v1", "v2", "v3"]}
    overrides, problems = envoy_overrides(_target(), ["edge"], backends)
    assert overrides == {"models": {"v1": 10.0, "v2": 90.0, "v3": 0.0}}
    assert problems == []
    _, problems = envoy_overrides(_target(), ["other-listener"], backends)
    assert problems == ["route models: not in the routes its group zone:/zone-a is served"]
    _, problems = envoy_overrides(_target(), ["edge"], {"models": ["v1"]})
    assert problems == ["route models: served to clusters v2 that the policy's route does not name"]


def _row(
    node: str, *, ok: bool, reachable: bool = True, problems: list[str] | None = None
) -> dict[str, Any]:
    run = {"ok": ok, "bars": [{"name": "activation frequency (all pools)", "ok": ok}]}
    return {"node": node, "reachable": reachable, "ok": ok, "problems": problems or [], "run": run}


def test_the_verdict_names_the_envoy_that_failed_and_why() -> None:
    passed = fleet_document("p.yaml", "http://cp", [_row("a", ok=True), _row("b", ok=True)], [])
    assert passed["ok"] is True and passed["verdict"] == "2/2 Envoys checked, every one passed"
    rows = [_row("a", ok=True), _row("b", ok=False, problems=["config not in sync"])]
    failed = fleet_document("p.yaml", "http://cp", rows, [_target("c", connected=False)])
    assert failed["ok"] is False
    assert failed["failed"] == ["b"] and failed["unreachable"] == []
    assert (
        "b failed: bar 'activation frequency (all pools)' missed; config not in sync"
        in (failed["verdict"])
    )
    assert "a failed" not in failed["verdict"]
    assert failed["skipped"] == [{"node": "c", "reason": "disconnected from the control plane"}]


def test_an_unreachable_envoy_or_a_silent_replica_fails_the_fleet() -> None:
    rows = [_row("a", ok=True), _row("b", ok=False, reachable=False, problems=["cannot reach"])]
    document = fleet_document("p.yaml", "http://cp", rows, [])
    assert (document["ok"], document["unreachable"]) == (False, ["b"])
    assert (
        "1/2 Envoys checked" in document["verdict"]
        and "b not checked: cannot reach" in (document["verdict"])
    )
    silent = fleet_document("p.yaml", "http://cp", [_row("a", ok=True)], [], ["replica r2 gone"])
    assert silent["ok"] is False and "replica r2 gone" in silent["verdict"]


def test_the_text_report_has_a_row_per_envoy_and_the_verdict() -> None:
    reached = {"zone": "zone-a", "gateway": "http://10.0.0.2:10000", "in_sync": True}
    rows = [
        _row("a", ok=True) | reached,
        _row("b", ok=False, reachable=False, problems=["Envoy b: cannot reach its listener"])
        | {"zone": "", "gateway": None, "address": "10.0.0.3", "address_source": "advertised",
           "in_sync": False, "run": None},
    ]  # fmt: skip
    rows[0]["run"]["bars"].append({"name": "routed correctly", "ok": True, "measured": "100.00%"})
    rows[0]["run"]["bars"][0]["measured"] = "p = 0.52"
    document = fleet_document("p.yaml", "http://cp", rows, [_target("c", connected=False)])
    console = Console(record=True, width=200)
    render_fleet(document, console, per_envoy=False)
    text = console.export_text()
    assert "http://10.0.0.2:10000" in text and "p = 0.52" in text and "100.00%" in text
    assert "10.0.0.3 (advertised)" in text and "NOT CHECKED" in text
    assert "skipped" in text and "disconnected from the control plane" in text
    assert "1/2 Envoys checked; b not checked: Envoy b: cannot reach its listener" in text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--envoy", "a"], "--envoy and --all-envoys ask the control plane: give --admin"),
        (["--all-envoys"], "--envoy and --all-envoys ask the control plane: give --admin"),
        ([], "give --gateway URL, or --admin URL to verify the Envoys it reports"),
    ],
)
def test_fleet_options_without_a_control_plane_are_usage_errors(
    tmp_path: Path, args: list[str], says: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    result = CliRunner().invoke(app, ["verify", "-f", str(policy), *args])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())
