"""The demo's rollout scene as printed: each decision line carries the step, the canary's
weight, the window's per-version counts and the verdict with its statistic and thresholds;
the scene's policies are valid rollouts; a demo fault refuses impossible settings."""

from __future__ import annotations

import pytest

from inferway.controllers.rollout.controller import RolloutController
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.devtools.demo import build_demo_policy
from inferway.devtools.demo_fault import DemoFault
from inferway.devtools.demo_rollout import ROLLOUT_STEPS, build_rollout_policy, format_decision
from inferway.gateway.rollouts.config import build_rollout_config

PORTS = {"v1": 8001, "v2": 8002, "v3": 8003}


def _controller(name: str = "demo-v3") -> RolloutController:
    stable, canary = ("model-v1", "model-v2") if name == "demo-v2" else ("model-v2", "model-v3")
    policy = build_rollout_policy(build_demo_policy(10000, PORTS, 50), name, stable, canary)
    return RolloutController(build_rollout_config(policy.rollouts[0]))


def test_the_scene_policy_is_a_rollout_from_all_stable_on_the_inference_route() -> None:
    policy = build_rollout_policy(
        build_demo_policy(10000, PORTS, 50), "demo-v3", "model-v2", "model-v3"
    )
    route = policy.routes[0]
    assert [(b.service, b.weight) for b in route.backends] == [("model-v2", 100), ("model-v3", 0)]
    (rollout,) = policy.rollouts
    assert (rollout.route, rollout.stable, rollout.canary) == (route.name, "model-v2", "model-v3")
    assert tuple(s.weight for s in rollout.steps) == ROLLOUT_STEPS
    assert rollout.analysis.interval == 1.0 and rollout.on_failure == "rollback"


def test_a_hold_shows_step_weight_counts_and_how_many_more_requests_the_test_needs() -> None:
    controller = _controller()
    start = controller.tick(0.0, None)
    assert format_decision(start, "model-v2", "model-v3") == [
        "step 0 · v3 at 20% · start: started: step 0 at 20%"
    ]
    hold = controller.tick(
        1.0, WindowSample(stable=VersionCounts(300, 0, {}), canary=VersionCounts(75, 3, {}))
    )
    head, verdict = format_decision(hold, "model-v2", "model-v3")
    assert head.startswith(
        "step 0 · v3 at 20% · window v2 300 req 0 err, v3 75 req 3 err · hold: error-rate: need ~"
    ), head
    assert verdict.startswith("    error-rate: need_more (sprt, LLR +"), verdict
    assert "(pass <= -2.99, fail >= 6.91); canary 3/75 errors vs stable 0/300)" in verdict


def test_a_rollback_line_shows_the_failed_verdict_and_the_weight_back_at_zero() -> None:
    controller = _controller()
    controller.tick(0.0, None)
    rollback = controller.tick(
        1.0, WindowSample(stable=VersionCounts(600, 0, {}), canary=VersionCounts(150, 12, {}))
    )
    assert rollback.action == "rollback"
    head, verdict = format_decision(rollback, "model-v2", "model-v3")
    assert head.startswith("step 0 · v3 at 0% · window v2 600 req 0 err, v3 150 req 12 err · ")
    assert "rollback: check failed: error-rate: 12/150 errors" in head
    assert verdict.startswith("    error-rate: fail (sprt, LLR +")


def test_a_good_canary_advances_through_each_step_in_the_printed_lines() -> None:
    controller = _controller("demo-v2")
    lines = [format_decision(controller.tick(0.0, None), "model-v1", "model-v2")[0]]
    for t in range(1, 10):
        window = WindowSample(stable=VersionCounts(400, 0, {}), canary=VersionCounts(400, 0, {}))
        decision = controller.tick(float(t), window)
        lines.append(format_decision(decision, "model-v1", "model-v2")[0])
        if decision.action == "promote":
            break
    assert any(" · v2 at 50% · " in line and "advance:" in line for line in lines), lines
    assert lines[-1].startswith("step 2 · v2 at 100% · window v1 400 req 0 err, v2 400 req")
    assert "promote: step passed" in lines[-1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"error_rate": 1.5}, "error_rate must be within 0..1"), ({"delay_ms": -1}, "negative")],
)
def test_a_demo_fault_refuses_impossible_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DemoFault(**kwargs)
