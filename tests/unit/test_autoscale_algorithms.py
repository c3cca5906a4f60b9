"""Each algorithm on hand-made samples: what it recommends and why."""

from __future__ import annotations

import json
import math

import pytest

from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.forecast import ForecastError, HoltWinters
from inferway.controllers.autoscale.samples import MetricSample, needed_replicas
from inferway.gateway.autoscale_policy import autoscale_config

BASE = {
    "metric": "request_rate",
    "target": 100,
    "sampling_interval": 5,
    "min_replicas": 1,
    "max_replicas": 50,
    "cooldown": 0,
    "stabilization": 0,
    "panic": False,
}


def scaler(**overrides) -> Autoscaler:
    return Autoscaler(autoscale_config("svc", {**BASE, **overrides}))


def feed(a: Autoscaler, t: float, **values: float) -> None:
    a.observe(MetricSample(time=t, **values))


def test_needed_replicas_divides_totals_and_scales_means():
    assert needed_replicas("request_rate", 450, ready=3, target=100) == 4.5
    assert needed_replicas("utilization", 0.9, ready=4, target=0.6) == pytest.approx(6.0)
    assert needed_replicas("p99_latency", 0.05, ready=2, target=0.1) == pytest.approx(1.0)


def test_threshold_rule_adds_an_instance_then_waits_out_its_cooldown():
    rule = {
        "scaling_policy": {
            "metric_type": "queue_length",
            "threshold": 1000,
            "action": "add_instance",
            "cooldown": 300,
        },
        "instance_type": "gpu-8x",
        "min_size": 2,
        "max_size": 16,
    }
    a = Autoscaler(autoscale_config("svc", rule))
    feed(a, 0, queue_length=1500)
    first = a.decide(0, current=2, ready=2)
    assert (first.desired, first.direction) == (3, "up")
    assert "queue_length 1500 > threshold 1000" in first.reason
    feed(a, 100, queue_length=1500)
    held = a.decide(100, current=3, ready=3)
    assert held.desired == 3
    assert [c.name for c in held.clamps] == ["cooldown_up"]
    feed(a, 300, queue_length=1500)
    assert a.decide(300, current=3, ready=3).desired == 4
    feed(a, 400, queue_length=10)
    assert a.decide(400, current=4, ready=4).desired == 4  # the rule never scales in


def test_threshold_scales_in_below_its_scale_in_threshold():
    a = scaler(
        algorithm="threshold",
        metric="queue_length",
        threshold={"threshold": 50, "scale_in_threshold": 10},
    )
    feed(a, 5, queue_length=5)
    assert a.decide(5, current=4, ready=4).desired == 3


def test_proportional_is_hpa_rule_with_tolerance():
    a = scaler()
    feed(a, 5, request_rate=420)
    d = a.decide(5, current=4, ready=4)
    assert (d.raw, d.desired) == (4, 4)  # 4.2 is within 10% of 4: hold
    assert d.inputs["request_rate"] == 420
    assert "within tolerance" in d.reason
    feed(a, 10, request_rate=460)  # window 5 s: the mean is this sample alone
    d = a.decide(10, current=4, ready=4)
    assert d.desired == 5 and d.raw == pytest.approx(4.6)


def test_tolerance_can_differ_by_direction():
    a = scaler(tolerance={"up": 0.0, "down": 0.2})
    feed(a, 5, request_rate=410)
    assert a.decide(5, current=4, ready=4).desired == 5  # no band above
    feed(a, 10, request_rate=420)
    assert a.decide(10, current=5, ready=5).desired == 5  # 4.2 is within 20% below 5


def test_near_the_slo_the_latency_guard_drops_the_up_tolerance():
    a = scaler(latency_guard=0.09)
    feed(a, 5, request_rate=420, p99_latency=0.05)
    assert a.decide(5, current=4, ready=4).desired == 4
    feed(a, 10, request_rate=420, p99_latency=0.095)
    d = a.decide(10, current=4, ready=4)
    assert d.desired == 5
    assert "p99 95 ms >= guard 90 ms" in d.reason
    feed(a, 15, request_rate=380, p99_latency=0.095)  # the guard never speeds a scale-in
    assert a.decide(15, current=4, ready=4).desired == 4


def test_proportional_backlog_adds_the_replicas_that_drain_the_queue():
    a = scaler(backlog_drain=10)
    feed(a, 5, request_rate=400, queue_length=2000)
    d = a.decide(5, current=4, ready=4)
    assert d.raw == pytest.approx(4 + 2000 / 10 / 100)
    assert d.desired == 6


def test_missing_metric_holds_and_says_so():
    a = scaler()
    feed(a, 5, queue_length=3)
    d = a.decide(5, current=3, ready=3)
    assert d.desired == 3 and d.raw is None
    assert "no request_rate sample" in d.reason


def test_pid_proportional_gain_and_deadband():
    a = scaler(algorithm="pid", pid={"kp": 0.5, "ki": 0.0, "smoothing": 1.0, "deadband": 0.05})
    feed(a, 5, request_rate=800)
    d = a.decide(5, current=4, ready=4)
    assert d.detail["error"] == pytest.approx(1.0)
    assert d.raw == pytest.approx(4 * (1 + 0.5 * 1.0))
    feed(a, 10, request_rate=410)
    d = a.decide(10, current=4, ready=4)
    assert d.detail["error"] == 0.0 and d.raw == pytest.approx(4.0)


def test_pid_stops_integrating_while_replicas_start_and_at_max():
    a = scaler(
        algorithm="pid",
        max_replicas=6,
        pid={"kp": 0.0, "ki": 0.1, "smoothing": 1.0, "integral_limit": 100},
    )
    feed(a, 0, request_rate=400)
    a.decide(0, current=4, ready=4)
    feed(a, 10, request_rate=800)
    integrating = a.decide(10, current=4, ready=4)
    assert integrating.detail["integrating"] and integrating.detail["i"] == pytest.approx(1.0)
    feed(a, 20, request_rate=800)
    starting = a.decide(20, current=8, ready=4)  # 4 more on their way
    assert not starting.detail["integrating"]
    assert starting.detail["i"] == pytest.approx(1.0)  # unchanged: no windup
    feed(a, 30, request_rate=800)
    pinned = a.decide(30, current=6, ready=6)
    assert not pinned.detail["integrating"]


def test_pid_integral_is_bounded():
    a = scaler(
        algorithm="pid",
        pid={"kp": 0.0, "ki": 1.0, "smoothing": 1.0, "integral_limit": 0.5, "deadband": 0.0},
    )
    for t in range(0, 100, 5):
        feed(a, t, request_rate=300)
        d = a.decide(t, current=2, ready=2)
    assert d.detail["i"] == pytest.approx(0.5)


def test_pid_output_is_smoothed():
    a = scaler(algorithm="pid", pid={"kp": 1.0, "ki": 0.0, "smoothing": 0.5})
    feed(a, 5, request_rate=400)
    assert a.decide(5, current=4, ready=4).raw == pytest.approx(4.0)
    feed(a, 10, request_rate=800)
    assert a.decide(10, current=4, ready=4).raw == pytest.approx(6.0)  # halfway to 8


def test_holt_winters_learns_a_season_and_forecasts_it():
    model = HoltWinters(alpha=0.3, beta=0.05, gamma=0.3, phi=0.95, season_length=4)
    pattern = [10.0, 20.0, 40.0, 20.0]
    assert model.forecast(1) is None
    for _ in range(6):
        for y in pattern:
            model.update(y)
    assert model.ready
    assert [round(model.forecast(h), 1) for h in range(1, 5)] == pattern


def test_holt_without_season_follows_a_trend():
    model = HoltWinters(alpha=0.5, beta=0.5, gamma=0.0, phi=1.0, season_length=None)
    for y in range(0, 100, 10):
        model.update(float(y))
    assert model.forecast(2) == pytest.approx(110.0, abs=2.0)


def test_forecast_error_scores_forecasts_when_their_bucket_closes():
    errors = ForecastError(window=2)
    errors.expect(3, 100.0)
    errors.score(2, 50.0)  # nothing expected for bucket 2
    assert errors.mean is None
    errors.score(3, 80.0)
    assert errors.mean == pytest.approx(0.2)
    errors.score(4, 0.0)
    assert errors.scored == 1


PREDICTIVE = {
    "algorithm": "predictive",
    "sampling_interval": 10,
    "window": 10,
    "predictive": {"bucket": 60, "season": 600, "horizon": 120, "max_error": 0.2},
}


def _seasonal(t: float) -> float:
    """A 600 s season: 200 req/s, 1000 from 300 to 420 s."""
    return 1000.0 if 300 <= t % 600 < 420 else 200.0


def test_predictive_falls_back_to_reactive_until_the_forecaster_is_initialised():
    a = scaler(**PREDICTIVE)
    feed(a, 10, request_rate=200)
    d = a.decide(10, current=2, ready=2)
    assert d.detail["mode"] == "reactive" and "not initialised" in d.reason
    assert d.desired == 2


def test_predictive_pre_scales_before_a_seasonal_rise():
    a = scaler(**PREDICTIVE)
    for t in range(0, 1800 + 200, 10):  # three seasons and a bit
        feed(a, t, request_rate=_seasonal(t))
    d = a.decide(2190, current=2, ready=2)  # 110 s before the 1000 req/s plateau
    assert d.detail["mode"] == "forecast"
    assert d.detail["forecast_error"] < 0.2
    assert d.desired == 10  # ready for 1000 req/s while the load is still 200
    assert "forecast peak" in d.reason
    json.dumps(d.to_dict())


def test_predictive_falls_back_when_its_forecasts_have_been_poor():
    a = scaler(**PREDICTIVE)
    for t in range(0, 1800 + 200, 10):
        feed(a, t, request_rate=_seasonal(t))
    for t in range(2000, 4000, 10):  # the pattern breaks: flat load
        feed(a, t, request_rate=500.0 if (t // 60) % 2 else 50.0)
    d = a.decide(3990, current=5, ready=5)
    assert d.detail["mode"] == "reactive"
    assert "forecast error" in d.reason and d.detail["forecast_error"] > 0.2


def test_predictive_scale_in_agreed_by_the_forecast_skips_stabilization():
    a = scaler(**{**PREDICTIVE, "stabilization": {"down": 300}})
    for t in range(0, 1800 + 440, 10):
        feed(a, t, request_rate=_seasonal(t))
    d = a.decide(2430, current=10, ready=10)  # plateau over, forecast stays low
    assert d.detail["mode"] == "forecast"
    assert d.desired == 2
    assert "stabilization_down" not in [c.name for c in d.clamps]


def test_decision_is_json_with_its_inputs_and_clamps():
    a = scaler(max_replicas=5, max_step={"up": 2})
    feed(a, 5, request_rate=math.inf)
    d = a.decide(5, current=2, ready=2)
    assert d.raw is None  # a non-finite sample counts as missing
    feed(a, 10, request_rate=900)
    d = a.decide(10, current=2, ready=2)
    data = json.loads(json.dumps(d.to_dict()))
    assert data["desired"] == 4 and data["direction"] == "up"
    assert data["inputs"]["request_rate"] == 900.0
    assert [c["name"] for c in data["clamps"]] == ["max_step_up"]
    assert data["clamps"][0] == {
        "name": "max_step_up",
        "before": 9,
        "after": 4,
        "detail": "at most +2",
    }
    assert "scale out 2->4" in data["reason"]


def test_samples_out_of_time_order_and_negative_counts_are_refused():
    a = scaler()
    feed(a, 10, request_rate=100)
    with pytest.raises(ValueError, match="older than the last one"):
        feed(a, 5, request_rate=100)
    with pytest.raises(ValueError, match="replica counts must be >= 0"):
        a.decide(10, current=-1, ready=0)


def test_a_rate_just_above_a_whole_count_stays_within_the_band_in_and_out_of_panic():
    """Issue 33 item 11: a step to 135.2 req/s at target 45 (3.004 replicas' worth) scaled
    1 -> 4 in panic and held 4, the reason printing "3.00 -> 4": the 10% up-band applies to
    the whole count asked for, in panic too."""
    a = scaler(target=45, sampling_interval=2, panic={"threshold": 2.0, "window": 6, "hold": 60})
    current = 1
    for t in range(0, 10, 2):
        feed(a, t, request_rate=15)
        assert a.decide(t, current=current, ready=current).desired == 1
    feed(a, 10, request_rate=135.2)
    step = a.decide(10, current=1, ready=1)
    assert step.panic and step.desired == 3, step.reason
    assert "= 3.00 -> 3" in step.reason
    feed(a, 12, request_rate=135.2)  # the new replicas still starting: panic asks no more
    assert a.decide(12, current=3, ready=1).desired == 3
    feed(a, 14, request_rate=150)  # 3.33 replicas' worth: beyond the band, a fourth
    assert a.decide(14, current=3, ready=3).desired == 4


def test_a_queue_wait_rule_scales_on_a_shortage_not_on_batching_delay():
    """Issue 33 item 11: delay-bound batching (D = 0.12 s) at 135 req/s queues 16.2 requests
    in total at any replica count; a rule on the summed queue (threshold 10) adds replicas to
    max without a shortage, a rule on the mean wait above D (0.3 s) holds, adds only when
    requests wait longer than the batcher holds them, and scales back in."""

    def rule(metric: str, threshold: float, below: float) -> Autoscaler:
        return Autoscaler(
            autoscale_config(
                "svc",
                {
                    "scaling_policy": {
                        "metric_type": metric,
                        "threshold": threshold,
                        "scale_in_threshold": below,
                        "action": "add_instance",
                        "cooldown": 0,
                    },
                    "min_size": 1,
                    "max_size": 4,
                },
            )
        )

    by_queue, by_wait = rule("queue_length", 10, 2), rule("queue_wait", 0.3, 0.05)
    queue_count = wait_count = 1
    for t in range(0, 40, 5):
        feed(by_queue, t, queue_length=16.2, request_rate=135)
        feed(by_wait, t, queue_wait=0.12, request_rate=135)
        queue_count = by_queue.decide(t, current=queue_count, ready=queue_count).desired
        wait_count = by_wait.decide(t, current=wait_count, ready=wait_count).desired
    assert (queue_count, wait_count) == (4, 1)
    feed(by_wait, 40, queue_wait=1.0)  # short of capacity: a second in line
    assert by_wait.decide(40, current=1, ready=1).desired == 2
    feed(by_wait, 45, queue_wait=0.01)  # idle: nothing held
    assert by_wait.decide(45, current=2, ready=2).desired == 1
