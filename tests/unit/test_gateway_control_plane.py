"""ControlPlane: a good policy becomes the cache's snapshot; a bad one is refused and recorded."""

from __future__ import annotations

import pytest

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway.gateway.control_plane import (
    AppliedPolicy,
    ControlPlane,
    PolicyFollower,
    PolicyRefusedError,
    Refusal,
)
from inferway.policies.errors import PolicyError, PolicyIssue
from inferway.policies.model import Endpoint
from inferway.resolve import IR, resolve_policy
from inferway.state import State, TlsMaterial
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import Resources
from inferway.xds.translate import translate
from tests.canary_policy import make_policy


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

    def dangling(_ir: IR) -> Resources:
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

    def broken(_ir: IR) -> Resources:
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


def test_runtime_endpoints_replace_inline_ones_and_repush_the_live_policy() -> None:
    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    before = plane.apply_policy(make_policy(10), "p.yaml")
    moved = State(endpoints={"v2": (Endpoint(host="127.0.0.1", port=9999),)})
    after = plane.update_state(moved, "endpoints.yaml")
    assert after is not None and after != before
    assert cache.get_snapshot().version == after
    assert plane.state is moved
    # A later policy edit keeps using the runtime endpoints.
    again = plane.apply_policy(make_policy(20), "p.yaml")
    ir = resolve_policy(make_policy(20), moved)
    (service,) = [s for s in ir.services if s.name == "v2"]
    assert [(e.host, e.port) for e in service.endpoints] == [("127.0.0.1", 9999)]
    assert again == cache.get_snapshot().version


def test_a_refused_state_update_keeps_the_previous_state_and_snapshot() -> None:
    cache = SnapshotCache()

    def strict(ir: IR) -> Resources:
        if any(len(s.endpoints) > 1 for s in ir.services):
            raise ValueError("one endpoint per service expected")
        return translate(ir)

    plane = ControlPlane(cache, clock=Clock(), translate=strict)
    kept = plane.apply_policy(make_policy(10), "p.yaml")
    extra = (Endpoint(host="127.0.0.1", port=8001), Endpoint(host="127.0.0.1", port=8009))
    with pytest.raises(PolicyRefusedError):
        plane.update_state(State(endpoints={"v1": extra}), "endpoints.yaml")
    assert cache.get_snapshot().version == kept
    assert plane.state.endpoints == {}


def test_a_weight_override_naming_no_backend_of_its_route_is_refused() -> None:
    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    kept = plane.apply_policy(make_policy(10), "p.yaml")
    with pytest.raises(PolicyRefusedError) as refused:
        plane.update_state(State(weights={"model": {"v3": 50}}), "rollout")
    assert "route 'model': v3 is not a backend of the route" in str(refused.value)
    assert cache.get_snapshot().version == kept
    assert plane.state.weights == {}


def test_a_weight_override_moves_traffic_without_a_policy_edit() -> None:
    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    plane.apply_policy(make_policy(10), "p.yaml")
    plane.update_state(State(weights={"model": {"v1": 50, "v2": 50}}), "rollout")
    # routes[0] is the listener's 413 route (limits.max_request_bytes); [1] the policy's first
    route = cache.get_snapshot().resources.of_type(type_urls.ROUTE)["public"]
    clusters = route.virtual_hosts[0].routes[1].route.weighted_clusters.clusters  # type: ignore[attr-defined]
    assert [(c.name, c.weight.value) for c in clusters] == [("v1", 5000), ("v2", 5000)]
    plane.update_state(State(), "rollout")  # undoing the override is a State change
    route = cache.get_snapshot().resources.of_type(type_urls.ROUTE)["public"]
    clusters = route.virtual_hosts[0].routes[1].route.weighted_clusters.clusters  # type: ignore[attr-defined]
    assert [(c.name, c.weight.value) for c in clusters] == [("v1", 9000), ("v2", 1000)]


def test_tls_material_never_shows_its_private_key() -> None:
    material = TlsMaterial(certificate_chain=b"CERT", private_key=b"SECRET-KEY")
    assert "SECRET-KEY" not in repr(material)


def _ack_all(cache: SnapshotCache, handle, snapshot) -> None:
    for type_url, version in snapshot.versions.items():
        cache.record_ack(handle, type_url, version)


def test_a_snapshot_envoy_rejects_is_refused_and_the_last_good_policy_is_live_again() -> None:
    from inferway._xds_protos.envoy.config.core.v3 import base_pb2
    from inferway.gateway.control_plane import DEGRADED_REJECTED

    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    good = plane.apply_policy(make_policy(10), "policy.yaml")
    handle = cache.open_stream(base_pb2.Node(id="envoy-1", cluster="inferway"))
    _ack_all(cache, handle, cache.get_snapshot())
    assert cache.good_snapshot().version == good  # type: ignore[union-attr]

    bad = plane.apply_policy(make_policy(50), "policy.yaml")
    assert plane.version == bad and plane.degraded is None  # pushed, not yet answered
    cache.record_nack(
        handle,
        type_urls.ROUTE,
        "v",
        "n1",
        "missing ): tr(ue",
        snapshot=bad,
        resource_names=("public",),
    )
    assert cache.get_snapshot().version == good  # type: ignore[union-attr]
    assert plane.version == good and plane.policy == make_policy(10)
    refusal = plane.last_refused
    assert refusal is not None and refusal.file == "policy.yaml" and plane.refusal_pending
    assert refusal.rejected_by_envoy is not None
    assert "routes public of snapshot" in refusal.lines()[0]
    assert "missing ): tr(ue" in refusal.lines()[0]
    assert plane.degraded is not None and plane.degraded.startswith(DEGRADED_REJECTED)

    # the same rejected content again is refused at once, without pushing it
    with pytest.raises(PolicyRefusedError, match=r"missing \): tr\(ue"):
        plane.apply_policy(make_policy(50), "policy.yaml")
    assert cache.get_snapshot().version == good  # type: ignore[union-attr]

    # a runtime change re-pushes the last good policy, not the rejected one
    state = State(endpoints={"v1": (Endpoint(host="127.0.0.1", port=8011),)})
    version = plane.update_state(state, "endpoints.yaml")
    assert version not in (good, bad) and plane.policy == make_policy(10)

    # the next good edit applies and clears the degraded state
    fixed = plane.apply_policy(make_policy(20), "policy.yaml")
    assert plane.version == fixed and plane.degraded is None and not plane.refusal_pending


def test_a_rejection_of_a_snapshot_the_plane_did_not_push_is_not_its_refusal() -> None:
    from inferway._xds_protos.envoy.config.core.v3 import base_pb2

    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    good = plane.apply_policy(make_policy(10), "policy.yaml")
    handle = cache.open_stream(base_pb2.Node(id="envoy-1", cluster="inferway"))
    cache.record_nack(handle, type_urls.CLUSTER, "v", "n1", "no", snapshot="someone-else")
    assert plane.version == good and plane.last_refused is None and plane.degraded is None


def test_a_rejection_of_an_already_replaced_snapshot_does_not_degrade_the_live_one() -> None:
    from inferway._xds_protos.envoy.config.core.v3 import base_pb2

    cache = SnapshotCache()
    plane = ControlPlane(cache, clock=Clock())
    plane.apply_policy(make_policy(10), "policy.yaml")
    handle = cache.open_stream(base_pb2.Node(id="envoy-1", cluster="inferway"))
    _ack_all(cache, handle, cache.get_snapshot())
    replaced = plane.apply_policy(make_policy(50), "policy.yaml")
    live = plane.apply_policy(make_policy(60), "policy.yaml")
    cache.record_nack(handle, type_urls.ROUTE, "v", "n1", "late", snapshot=replaced)
    assert cache.is_rejected(replaced) and plane.version == live
    assert plane.degraded is None and plane.last_refused is None


def test_observers_are_told_in_order_a_failing_one_breaks_nothing_and_a_non_observer_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plane = ControlPlane(SnapshotCache(), clock=Clock())
    told: list[tuple[str, object]] = []

    class Broken(PolicyFollower):
        def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
            raise RuntimeError("metrics backend down")

    class Recorder(PolicyFollower):
        def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
            told.append(("applied", changed))

        def on_refused(self, refusal: Refusal) -> None:
            told.append(("refused", refusal.file))

    plane.add_observer(Broken())
    plane.add_observer(Recorder())
    with pytest.raises(TypeError, match="subclass PolicyFollower"):
        plane.add_observer(object())  # type: ignore[arg-type]
    plane.apply_policy(make_policy(10), "policy.yaml")
    plane.apply_policy(make_policy(10), "policy.yaml")
    plane.refuse(PolicyError([PolicyIssue("policy.yaml", 1, 1, "", "bad")]))
    assert told == [("applied", True), ("applied", False), ("refused", "policy.yaml")]
    assert "control plane observer" in caplog.text and "on_applied failed" in caplog.text
