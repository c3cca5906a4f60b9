"""Properties of every algorithm under any load: the replica count stays within [min, max],
never moves by more than the max step, and never moves in a direction still cooling down."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.samples import MetricSample
from inferway.gateway.autoscale_policy import autoscale_config


@st.composite
def configs(draw: st.DrawFn) -> dict:
    lo = draw(st.integers(0, 4))
    algorithm = draw(st.sampled_from(["threshold", "proportional", "pid", "predictive"]))
    data: dict = {
        "algorithm": algorithm,
        "metric": "request_rate",
        "sampling_interval": 5,
        "min_replicas": lo,
        "max_replicas": draw(st.integers(max(lo, 1), lo + 12)),
        "cooldown": {
            "up": draw(st.sampled_from([0, 5, 30])),
            "down": draw(st.sampled_from([0, 10, 60])),
        },
        "stabilization": {
            "up": draw(st.sampled_from([0, 15])),
            "down": draw(st.sampled_from([0, 20, 120])),
        },
        "panic": {"enabled": draw(st.booleans()), "window": 6, "hold": 30},
    }
    steps = {k: draw(st.one_of(st.none(), st.integers(1, 3))) for k in ("up", "down")}
    if any(v is not None for v in steps.values()):
        data["max_step"] = {k: v for k, v in steps.items() if v is not None}
    if algorithm == "threshold":
        data["threshold"] = {
            "threshold": 800,
            "scale_in_threshold": 200,
            "step": draw(st.integers(1, 4)),
        }
    else:
        data["target"] = 100
    if algorithm in ("proportional", "predictive"):
        data["backlog_drain"] = 30
        data["latency_guard"] = 0.05
        data["tolerance"] = {"up": draw(st.sampled_from([0, 0.1])), "down": 0.1}
    if algorithm == "predictive":
        data["predictive"] = {"bucket": 10, "season": 60, "horizon": 20, "max_error": 0.5}
    return data


steps_strategy = st.lists(
    st.tuples(
        st.sampled_from([5, 5, 10, 15]),  # seconds to the next sample and decision
        st.floats(0, 3000),  # request rate
        st.floats(0, 500),  # queue length
        st.floats(0, 1),  # fraction of the replicas that is ready
        st.floats(0, 0.2),  # p99 latency
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=configs(), steps=steps_strategy, start=st.integers(0, 20))
def test_decisions_stay_in_bounds_respect_steps_and_cooldowns(data, steps, start):
    config = autoscale_config("svc", data)
    lim = config.limits
    a = Autoscaler(config)
    current = min(max(start, lim.min_replicas), lim.max_replicas)
    now = 0.0
    last_up = last_change = -float("inf")
    for dt, rate, queue, ready_share, p99 in steps:
        now += dt
        a.observe(MetricSample(time=now, request_rate=rate, queue_length=queue, p99_latency=p99))
        ready = round(current * ready_share)
        d = a.decide(now, current=current, ready=ready)
        assert lim.min_replicas <= d.desired <= lim.max_replicas, d
        if lim.max_step_up is not None:
            assert d.desired - current <= lim.max_step_up, d
        if lim.max_step_down is not None:
            assert current - d.desired <= lim.max_step_down, d
        if d.desired > current:
            assert now - last_up >= lim.cooldown_up_s, d
            last_up = last_change = now
        elif d.desired < current:
            assert now - last_change >= lim.cooldown_down_s, d
            assert not d.panic, d  # no scale-in during panic
            last_change = now
        current = d.desired


@settings(max_examples=60, deadline=None)
@given(data=configs(), rate=st.floats(0, 3000), current=st.integers(0, 40))
def test_a_count_outside_the_bounds_is_brought_inside(data, rate, current):
    config = autoscale_config("svc", data)
    a = Autoscaler(config)
    a.observe(MetricSample(time=5, request_rate=rate))
    d = a.decide(5, current=current, ready=current)
    assert config.limits.min_replicas <= d.desired <= config.limits.max_replicas
