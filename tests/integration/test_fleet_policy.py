"""A fleet refuses local ``replicas:`` (each control-plane replica would start its own set):
at start and as an edit, located by the field, and the last good policy stays live."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferway.gateway.control_plane import ControlPlane, PolicyRefusedError
from inferway.gateway.fleet.fleet_policy import fleet_policy_issues
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.policies.errors import PolicyError
from inferway.policies.loader import load_policy_text
from inferway.xds.cache import SnapshotCache

PLAIN = """\
version: 1
listeners: [{name: main, address: 127.0.0.1, port: 10000}]
services:
  - name: model
    endpoints: ["127.0.0.1:8000"]
routes:
  - name: all
    backends: [{service: model}]
"""
LOCAL = """\
version: 1
listeners: [{name: main, address: 127.0.0.1, port: 10000}]
services:
  - name: other
    endpoints: ["127.0.0.1:8001"]
  - name: model
    replicas:
      command: inferway serve --model-repository ./models --http-port {port}
routes:
  - name: all
    backends: [{service: model}]
"""


def test_local_replicas_are_named_by_their_field() -> None:
    assert fleet_policy_issues(load_policy_text(PLAIN, "p.yaml"), "p.yaml") == []
    (issue,) = fleet_policy_issues(load_policy_text(LOCAL, "p.yaml"), "p.yaml")
    assert issue.path == "services[1].replicas" and issue.file == "p.yaml"
    assert "service 'model' runs local replicas" in issue.message
    assert "kubernetes target or the KEDA/HPA components" in issue.message


def test_a_gated_edit_is_refused_and_the_last_good_policy_stays() -> None:
    plane = ControlPlane(SnapshotCache())
    plane.policy_gate = fleet_policy_issues
    version = plane.apply_policy(load_policy_text(PLAIN, "p.yaml"), "p.yaml")
    with pytest.raises(PolicyRefusedError):
        plane.apply_policy(load_policy_text(LOCAL, "p.yaml"), "p.yaml")
    assert plane.version == version
    refused = plane.last_refused
    assert refused is not None and "services[1].replicas" in str(vars(refused))


async def test_a_fleet_replica_will_not_start_on_a_policy_with_local_replicas(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(LOCAL)
    options = GatewayOptions(
        policy_path=policy,
        xds_port=0,
        admin_port=0,
        with_envoy=False,
        workdir=tmp_path / "work",
        store=f"file:{tmp_path / 'store'}",
    )
    with pytest.raises(PolicyError, match=r"services\[1\]\.replicas: service 'model' runs local"):
        await start_gateway(options)
