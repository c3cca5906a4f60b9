"""ControlPlane: a good policy becomes the cache's snapshot; a bad one is refused and recorded."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2

from inferway.gateway.control_plane import ControlPlane, PolicyRefusedError
from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.model import Policy
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import Resources


def make_policy(canary_weight: float) -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "public", "port": 10000}],
            "services": [
                {"name": "v1", "endpoints": ["127.0.0.1:8001"]},
                {"name": "v2", "endpoints": ["127.0.0.1:8002"]},
            ],
            "routes": [
                {
                    "name": "model",
                    "backends": [
                        {"service": "v1", "weight": 100 - canary_weight},
                        {"service": "v2", "weight": canary_weight},
                    ],
                }
            ],
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def test_apply_policy_sets_the_cache_snapshot_and_records_it() -> None:
    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    version = plane.apply_policy(make_policy(10), "policy.yaml")
    snapshot = cache.get_snapshot("default")
    assert snapshot is not None and snapshot.version == version
    assert set(snapshot.resources_of(type_urls.CLUSTER)) == {"v1", "v2"}
    assert plane.version == version and plane.source == "policy.yaml"
    assert plane.applied_at == 1001.0
    assert plane.last_refused is None and not plane.refusal_pending

    second = plane.apply_policy(make_policy(50), "policy.yaml")
    assert second != version
    assert cache.get_snapshot().version == second


def test_reapplying_the_same_policy_keeps_its_version() -> None:
    plane = ControlPlane(SnapshotCache(), clock=Clock())
    first = plane.apply_policy(make_policy(10), "a.yaml")
    assert plane.apply_policy(make_policy(10), "a.yaml") == first


def test_an_inconsistent_snapshot_is_refused_and_the_good_one_kept() -> None:
    cache = SnapshotCache()
    good = ControlPlane(cache, clock=Clock())
    kept = good.apply_policy(make_policy(10), "p.yaml")

    def dangling(_policy: Policy) -> Resources:
        cluster = cluster_pb2.Cluster(name="orphan", type=cluster_pb2.Cluster.EDS)
        return Resources.build({type_urls.CLUSTER: [("orphan", cluster)]})

    bad = ControlPlane(cache, clock=Clock(), translate=dangling)
    with pytest.raises(PolicyRefusedError) as caught:
        bad.apply_policy(make_policy(20), "p.yaml")
    assert "orphan" in str(caught.value)
    assert bad.last_refused is not None and bad.refusal_pending
    assert cache.get_snapshot().version == kept


def test_a_translation_failure_is_recorded_as_a_refusal() -> None:
    cache = SnapshotCache()

    def broken(_policy: Policy) -> Resources:
        raise ValueError("cannot translate this")

    plane = ControlPlane(cache, clock=Clock(), translate=broken)
    with pytest.raises(PolicyRefusedError):
        plane.apply_policy(make_policy(10), "p.yaml")
    assert cache.get_snapshot() is None
    refusal = plane.last_refused
    assert refusal is not None and refusal.file == "p.yaml"
    assert "cannot translate this" in refusal.lines()[0]


def test_refuse_keeps_the_located_issues_and_clears_pending_after_a_good_apply() -> None:
    plane = ControlPlane(SnapshotCache(), clock=Clock())
    plane.apply_policy(make_policy(10), "p.yaml")
    issue = PolicyIssue("p.yaml", 7, 15, "routes[0].backends[1].weight", "must not be negative")
    refusal = plane.refuse(PolicyError([issue]))
    assert refusal.file == "p.yaml" and refusal.issues == (issue,)
    assert refusal.lines() == ["p.yaml:7:15: routes[0].backends[1].weight: must not be negative"]
    assert plane.refusal_pending
    plane.apply_policy(make_policy(30), "p.yaml")
    assert plane.last_refused == refusal  # kept as history
    assert not plane.refusal_pending
