"""Autoscaling config: the native form and the issue's rule form through the policy schema
(policies/autoscale.py) into the controller's types, and every bad input refused with each
field named, all at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from inferway.controllers.autoscale.params import PredictiveParams, ProportionalParams
from inferway.controllers.autoscale.samples import ADDITIVE_METRICS as CONTROLLER_ADDITIVE
from inferway.controllers.autoscale.samples import METRICS as CONTROLLER_METRICS
from inferway.gateway.autoscale_policy import autoscale_config, build_autoscale_config
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.autoscale import AutoscaleRule
from inferway.policies.autoscale_fields import ADDITIVE_METRICS, METRICS

HEAD = (
    "listeners: [{name: main, port: 10000}]\n"
    "services:\n"
    "  - name: chat\n"
    "    replicas: {command: 'serve {port}', min: 1, max: 8}\n"
    "    autoscale: "
)
TAIL = "\nroutes:\n  - name: all\n    backends: [{service: chat}]\n"


def _block(data: dict[str, Any]) -> Any:
    """The block as a policy file holding it (in JSON, which is YAML) loads it."""
    policy = load_policy_text(HEAD + json.dumps(data) + TAIL, "p.yaml")
    block = policy.services[0].autoscale
    assert block is not None
    return block


ISSUE_RULE_JSON = """
{"scaling_policy": {"metric_type": "queue_length", "threshold": 1000, "action": "add_instance",
                    "cooldown": 300}, "instance_type": "gpu-8x", "min_size": 2, "max_size": 16}
"""

ISSUE_RULE_YAML = """
scaling_policy:
  metric_type: queue_length
  threshold: 1000
  action: add_instance
  cooldown: 300
instance_type: gpu-8x
min_size: 2
max_size: 16
"""


@pytest.mark.parametrize("text", [ISSUE_RULE_JSON, ISSUE_RULE_YAML], ids=["json", "yaml"])
def test_the_issue_rule_is_accepted_in_its_exact_form(text):
    data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    block = _block(data)
    assert isinstance(block, AutoscaleRule)
    config = build_autoscale_config("chat", block)
    assert config.algorithm == "threshold"
    assert config.metric == "queue_length"
    assert config.instance_type == "gpu-8x"
    assert (config.limits.min_replicas, config.limits.max_replicas) == (2, 16)
    assert config.limits.cooldown_up_s == 300.0
    assert config.limits.max_step_up == 1
    assert config.params.threshold == 1000.0
    assert config.params.scale_in_threshold is None
    assert not config.panic.enabled


def _problems(data: dict[str, Any]) -> dict[str, str]:
    """Field (under ``services.chat.autoscale``) -> message, for a block the loader refuses."""
    with pytest.raises(PolicyError) as caught:
        _block(data)
    prefix = "services[0]."
    return {"services.chat." + i.path.removeprefix(prefix): i.message for i in caught.value.issues}


def test_rule_form_errors_name_their_fields_all_at_once():
    bad = {
        "scaling_policy": {
            "metric_type": "gpu_temp",
            "threshold": 10,
            "action": "reboot",
            "cooldown": 2,
            "colour": "red",
        },
        "min_size": 5,
        "max_size": 3,
    }
    problems = _problems(bad)
    prefix = "services.chat.autoscale."
    assert "unknown metric 'gpu_temp'" in problems[prefix + "scaling_policy.metric_type"]
    assert "expected add_instance" in problems[prefix + "scaling_policy.action"]
    assert "shorter than the sampling interval" in problems[prefix + "scaling_policy.cooldown"]
    assert "unknown key" in problems[prefix + "scaling_policy.colour"]
    assert "min_size (5) is greater than max_size (3)" in problems[prefix + "min_size"]


def test_native_form_applies_defaults():
    config = build_autoscale_config("chat", _block({"algorithm": "predictive", "target": 400}))
    assert config.metric == "request_rate"
    assert config.sampling_interval_s == 5.0
    assert isinstance(config.params, PredictiveParams)
    assert config.params.reactive == ProportionalParams(
        target=400.0, tolerance_up=0.1, tolerance_down=0.1, window_s=5.0
    )
    assert config.limits.stabilization_down_s == 300.0
    assert config.panic.enabled and config.panic.threshold == 2.0


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"min_replicas": 4, "max_replicas": 2, "target": 1}, "min_replicas", "greater than"),
        ({"metric": "gpu_temp", "target": 1}, "metric", "unknown metric 'gpu_temp'"),
        (
            {"cooldown": {"down": 3}, "sampling_interval": 10, "target": 1},
            "cooldown.down",
            "shorter than the sampling interval",
        ),
        ({"cooldown": 4, "target": 1}, "cooldown.up", "shorter than the sampling interval"),
        ({"algorithm": "magic", "target": 1}, "algorithm", "unknown algorithm"),
        ({"algorithm": "proportional"}, "target", "required"),
        ({"target": 1, "speed": 3}, "speed", "unknown key"),
        ({"target": -1}, "target", "must be > 0"),
        ({"target": 1, "max_step": {"up": 0}}, "max_step.up", "must be >= 1"),
        ({"target": 1, "panic": {"threshold": 0.5}}, "panic.threshold", "must be >= 1.0"),
        ({"target": 1, "pid": {"kq": 1}, "algorithm": "pid"}, "pid.kq", "unknown key"),
        (
            {"target": 1, "algorithm": "predictive", "metric": "p99_latency"},
            "metric",
            "service-total metric",
        ),
        (
            {"target": 1, "algorithm": "predictive", "predictive": {"season": 60}},
            "predictive.season",
            "at least two buckets",
        ),
        (
            {"target": 1, "metric": "in_flight", "backlog_drain": 10},
            "backlog_drain",
            "only applies to metric request_rate",
        ),
        (
            {"algorithm": "threshold", "threshold": {"threshold": 5, "scale_in_threshold": 9}},
            "threshold.scale_in_threshold",
            "must be below threshold",
        ),
        ({"target": "many"}, "target", "expected a number"),
        ({"target": 1, "algorithm": "pid", "tolerance": 0.2}, "tolerance", "pid.deadband"),
        ({"target": 1, "tolerance": {"up": 2}}, "tolerance.up", "must be <= 1.0"),
    ],
)
def test_bad_native_config_names_the_field(data, field, words):
    problems = _problems(data)
    assert f"services.chat.autoscale.{field}" in problems, problems
    assert words in problems[f"services.chat.autoscale.{field}"]


def test_a_zero_cooldown_is_allowed_and_means_none():
    config = autoscale_config("chat", {"target": 1, "cooldown": 0, "sampling_interval": 5})
    assert config.limits.cooldown_up_s == config.limits.cooldown_down_s == 0.0


def test_every_problem_is_reported_in_one_error():
    problems = _problems({"metric": "x", "min_replicas": 9, "max_replicas": 1})
    assert sorted(problems) == [
        "services.chat.autoscale.metric",
        "services.chat.autoscale.min_replicas",
        "services.chat.autoscale.target",
    ]
    assert problems["services.chat.autoscale.min_replicas"].startswith("min_replicas (9)")


def test_a_block_outside_a_policy_goes_through_the_same_schema():
    config = autoscale_config("chat", {"algorithm": "pid", "target": 3, "pid": {"kp": 0.4}})
    assert (config.algorithm, config.params.kp, config.params.window_s) == ("pid", 0.4, 5.0)
    with pytest.raises(ValueError, match="greater than max_replicas"):
        autoscale_config("chat", {"target": 1, "min_replicas": 3, "max_replicas": 2})


def test_the_schema_and_the_controller_name_the_same_metrics():
    assert METRICS == CONTROLLER_METRICS and ADDITIVE_METRICS == CONTROLLER_ADDITIVE
