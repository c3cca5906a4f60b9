"""The issue's scaling rule, accepted in exactly its published JSON/YAML form.

    {"scaling_policy": {"metric_type": "queue_length", "threshold": 1000,
                        "action": "add_instance", "cooldown": 300},
     "instance_type": "gpu-8x", "min_size": 2, "max_size": 16}

It becomes a ``threshold`` config: above ``threshold``, add one instance, then wait
``cooldown`` seconds. The rule says nothing about scaling in, so by default it never does;
``scale_in_threshold`` (and ``step``) inside ``scaling_policy`` are this project's additions.
The rule has no panic mode or stabilization, so both are off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferway.controllers.autoscale.config_reader import AutoscaleConfigError, ConfigReader
from inferway.controllers.autoscale.params import (
    AutoscaleConfig,
    Limits,
    PanicConfig,
    ThresholdParams,
)
from inferway.controllers.autoscale.samples import METRICS

__all__ = ["build_from_scaling_policy", "is_scaling_policy"]

_ACTIONS = ("add_instance",)


def is_scaling_policy(data: Any) -> bool:
    """True when ``data`` is in the rule's form (it has a ``scaling_policy`` key)."""
    return isinstance(data, Mapping) and "scaling_policy" in data


def build_from_scaling_policy(service: str, data: Mapping[str, Any]) -> AutoscaleConfig:
    """Validate the rule form and return its threshold config; raises AutoscaleConfigError."""
    r = ConfigReader(f"services.{service}.autoscale")
    top = r.mapping(
        data, "", {"scaling_policy", "instance_type", "min_size", "max_size", "sampling_interval"}
    )
    policy = r.mapping(
        top.get("scaling_policy"),
        "scaling_policy",
        {"metric_type", "threshold", "action", "cooldown", "scale_in_threshold", "step"},
    )
    metric = policy.get("metric_type")
    if metric not in METRICS:
        r.fail(
            "scaling_policy.metric_type",
            f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}",
        )
    action = policy.get("action")
    if action not in _ACTIONS:
        r.fail("scaling_policy.action", f"unknown action {action!r}; expected add_instance")
    threshold = r.number(policy, "threshold", None, name="scaling_policy.threshold")
    if threshold is None and "threshold" not in policy:
        r.fail("scaling_policy.threshold", "required")
    below = r.number(policy, "scale_in_threshold", None, name="scaling_policy.scale_in_threshold")
    if below is not None and threshold is not None and below >= threshold:
        r.fail(
            "scaling_policy.scale_in_threshold",
            f"must be below threshold ({threshold:g}), got {below:g}",
        )
    step = r.integer(policy, "step", 1, name="scaling_policy.step", minimum=1) or 1
    interval = r.number(top, "sampling_interval", 5.0, positive=True) or 5.0
    cooldown = r.number(policy, "cooldown", 300.0, name="scaling_policy.cooldown") or 0.0
    if 0 < cooldown < interval:
        r.fail(
            "scaling_policy.cooldown",
            f"cooldown {cooldown:g} s is shorter than the sampling interval ({interval:g} s)",
        )
    lo = r.integer(top, "min_size", 1)
    hi = r.integer(top, "max_size", 10, minimum=1)
    if lo is not None and hi is not None and lo > hi:
        r.fail("min_size", f"min_size ({lo}) is greater than max_size ({hi})")
    instance_type = top.get("instance_type")
    if instance_type is not None and not isinstance(instance_type, str):
        r.fail("instance_type", f"expected a string, got {instance_type!r}")
    if r.problems:
        raise AutoscaleConfigError(r.problems)
    assert threshold is not None and lo is not None and hi is not None
    limits = Limits(
        min_replicas=lo,
        max_replicas=hi,
        max_step_up=step,
        max_step_down=step,
        cooldown_up_s=cooldown,
        cooldown_down_s=cooldown,
        stabilization_up_s=0.0,
        stabilization_down_s=0.0,
    )
    return AutoscaleConfig(
        service=service,
        algorithm="threshold",
        metric=str(metric),
        sampling_interval_s=interval,
        limits=limits,
        panic=PanicConfig(enabled=False),
        params=ThresholdParams(threshold=threshold, step=step, scale_in_threshold=below),
        instance_type=instance_type,
        source=dict(top),
    )
