"""The simulation's parts behave as documented, so its table compares what it says it does:
the replica model's calibration, the cluster's start-up/drain/shedding, and the HPA and KPA
baselines' documented rules."""

from __future__ import annotations

import pytest

from bench.autoscale_baselines import HPA, KPA
from bench.autoscale_model import Cluster, ReplicaModel
from bench.autoscale_sim import run
from bench.autoscale_traces import Trace
from inferway.controllers.autoscale.samples import MetricSample


def test_replica_model_matches_the_measured_heavy_model():
    m = ReplicaModel()
    assert m.max_rate == pytest.approx(776, abs=1)
    assert m.sustained_rate() == pytest.approx(610, abs=2)
    assert m.batch_rows(0.5) == 1.0 and m.batch_rows(10_000) == 64.0


def test_cluster_replicas_serve_only_after_start_up_and_are_billed_through_drain():
    m = ReplicaModel(startup_s=10, drain_s=5)
    c = Cluster(m, 1)
    c.scale_to(0, 3)
    assert (c.current, c.ready) == (3, 1)
    for t in range(10):
        c.step(float(t), 0)
    assert c.ready == 1
    c.step(10.0, 0)
    assert c.ready == 3
    c.scale_to(11, 1)
    assert (c.current, c.ready, len(c.draining)) == (1, 1, 2)
    billed = c.replica_seconds
    for t in range(11, 20):
        c.step(float(t), 0)
    assert c.replica_seconds - billed == 9 + 2 * 5  # the drained two for 5 s more
    assert (c.actions, c.reversals) == (2, 1)


def test_cluster_overload_queues_then_sheds_and_violates_the_slo():
    m = ReplicaModel()
    c = Cluster(m, 1)
    assert not c.step(0.0, 400).violated
    over = [c.step(float(t), 2000) for t in range(1, 4)]
    assert all(s.violated for s in over)
    assert over[-1].shed > 0
    assert c.queue == pytest.approx(m.max_rate * m.max_queue_s)


def _feed(controller, t0: int, t1: int, rate: float) -> None:
    for t in range(t0, t1):
        controller.observe(MetricSample(time=float(t), request_rate=rate))


def test_hpa_tolerance_scale_up_limit_and_300_s_scale_down_stabilization():
    hpa = HPA(target=100, min_replicas=1, max_replicas=50)
    _feed(hpa, 0, 15, 1050)
    assert hpa.decide(15, current=10, ready=10) == 10  # 5% over: within tolerance 0.1
    _feed(hpa, 15, 30, 4000)
    assert hpa.decide(30, current=10, ready=10) == 20  # 40 wanted, +100% per sync at most
    _feed(hpa, 30, 45, 500)
    assert hpa.decide(45, current=20, ready=20) == 20  # 300 s window remembers 40
    for t in range(60, 360, 15):
        _feed(hpa, t - 15, t, 500)
        hpa.decide(float(t), current=20, ready=20)
    _feed(hpa, 345, 360, 500)
    assert hpa.decide(360, current=20, ready=20) == 5


def test_kpa_panics_at_200_percent_holds_then_follows_the_stable_window():
    kpa = KPA(target=100, min_replicas=1, max_replicas=50)
    _feed(kpa, 0, 60, 400)
    assert kpa.decide(60, current=4, ready=4) == 4
    _feed(kpa, 60, 66, 1000)  # the 6 s window asks for 10 >= 2 x 4 ready
    assert kpa.decide(66, current=4, ready=4) == 10
    _feed(kpa, 66, 100, 300)
    assert kpa.decide(100, current=10, ready=10) == 10  # panicking: no scale-in
    _feed(kpa, 100, 127, 300)
    assert kpa.decide(127, current=10, ready=10) == 5  # panic over; at most halve a tick


def test_the_harness_scores_a_comfortable_load_as_never_over_the_slo():
    shape = [900.0] * 300
    trace = Trace("flat", "flat", shape, shape)
    model = ReplicaModel()
    hpa = HPA(target=466, min_replicas=2, max_replicas=16)
    result = run(trace, hpa, model, 466)
    assert result["slo_violation_s"] == 0
    assert result["replica_seconds"] == 2 * 300
    assert result["actions"] == 0
