"""``inferway_policy_propagation_seconds``: observed once, when the last connected Envoy has
ACKed all of a changed policy, counting Envoys that connect while it propagates and not those
that leave. Each ACK checks its own node only (bench/fleet_propagation.py: checking every
node on every ACK made a 1,000-Envoy push quadratic), so these pin down what it observes."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.control_plane_metrics import ControlPlaneMetrics
from inferway.xds.cache import SnapshotCache, StreamHandle
from tests.canary_policy import make_policy


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ack_all(cache: SnapshotCache, handle: StreamHandle) -> None:
    snapshot = cache.get_snapshot()
    assert snapshot is not None
    for type_url, version in snapshot.versions.items():
        cache.record_ack(handle, type_url, version)


def _observed(metrics: ControlPlaneMetrics) -> tuple[float, float]:
    count = metrics.registry.get_sample_value("inferway_policy_propagation_seconds_count")
    total = metrics.registry.get_sample_value("inferway_policy_propagation_seconds_sum")
    return count or 0.0, total or 0.0


def _connect(cache: SnapshotCache, node: str) -> StreamHandle:
    return cache.open_stream(base_pb2.Node(id=node, cluster="inferway"))


def test_observed_once_when_the_last_envoy_is_in_sync_including_one_that_joined() -> None:
    cache, clock = SnapshotCache(), _Clock()
    plane = ControlPlane(cache)
    metrics = ControlPlaneMetrics.attach(plane, clock=clock)
    plane.apply_policy(make_policy(10), "policy.yaml")
    a, b = _connect(cache, "a"), _connect(cache, "b")
    _ack_all(cache, a)
    _ack_all(cache, b)

    plane.apply_policy(make_policy(20), "policy.yaml")
    clock.now = 101.0
    _ack_all(cache, a)
    late = _connect(cache, "late")  # joined while the change propagates: it counts too
    clock.now = 102.0
    _ack_all(cache, b)
    assert _observed(metrics) == (0.0, 0.0), "b and a are in sync, the late one is not"
    clock.now = 103.5
    _ack_all(cache, late)
    assert _observed(metrics) == (1.0, 3.5)
    _ack_all(cache, a)  # ACKs after it propagated observe nothing more
    assert _observed(metrics) == (1.0, 3.5)


def test_an_envoy_that_leaves_is_not_waited_for_and_a_superseded_change_is_not_observed() -> None:
    cache, clock = SnapshotCache(), _Clock()
    plane = ControlPlane(cache)
    metrics = ControlPlaneMetrics.attach(plane, clock=clock)
    plane.apply_policy(make_policy(10), "policy.yaml")
    a, b = _connect(cache, "a"), _connect(cache, "b")
    _ack_all(cache, a)
    _ack_all(cache, b)

    plane.apply_policy(make_policy(20), "policy.yaml")
    clock.now = 101.0
    plane.apply_policy(make_policy(30), "policy.yaml")  # supersedes 20 before anyone ACKed it
    clock.now = 102.0
    _ack_all(cache, a)
    assert _observed(metrics) == (0.0, 0.0)
    cache.close_stream(b)  # b leaves without ACKing: a's next ACK completes the change
    cache.record_ack(a, *next(iter(cache.get_snapshot().versions.items())))
    assert _observed(metrics) == (1.0, 1.0)
