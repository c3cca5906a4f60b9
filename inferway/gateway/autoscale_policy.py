"""A service's ``autoscale:`` block, validated by the policy schema, as the pure autoscaler's
:class:`AutoscaleConfig`.

The policy layer validates the block (policies/autoscale.py: every field and every rule
across fields, located on its line) and knows nothing of the controller; the controller
(controllers/autoscale) knows nothing of the policy. This is the one place that maps the
first onto the second, for either form: the native one and the issue's ``scaling_policy``
rule, which becomes a threshold config (add ``step`` above ``threshold``, then wait
``cooldown``; no panic mode or stabilization, which the rule does not have). Compiling a
validated block cannot fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter

from inferway.controllers.autoscale.params import (
    AutoscaleConfig,
    Limits,
    PanicConfig,
    Params,
    PIDParams,
    PredictiveParams,
    ProportionalParams,
    ThresholdParams,
)
from inferway.policies.autoscale import Autoscale, AutoscaleBlock, AutoscaleRule
from inferway.policies.model import Policy

__all__ = ["autoscale_config", "autoscale_configs", "build_autoscale_config"]

_BLOCK: TypeAdapter[Autoscale | AutoscaleRule] = TypeAdapter(AutoscaleBlock)


def autoscale_configs(policy: Policy) -> dict[str, AutoscaleConfig]:
    """Service name -> the config of its ``autoscale:`` block (services without one are
    left out)."""
    return {
        service.name: build_autoscale_config(service.name, service.autoscale)
        for service in policy.services
        if service.autoscale is not None
    }


def autoscale_config(service: str, block: Mapping[str, Any]) -> AutoscaleConfig:
    """A block as written (a mapping, outside a policy: the simulator, tests) through the same
    schema; raises pydantic's ValidationError (a policy file's are located by its loader)."""
    return build_autoscale_config(service, _BLOCK.validate_python(block))


def build_autoscale_config(service: str, block: Autoscale | AutoscaleRule) -> AutoscaleConfig:
    """The controller's config for ``service``'s validated block."""
    if isinstance(block, AutoscaleRule):
        return _from_rule(service, block)
    interval = block.sampling_interval
    limits = Limits(
        min_replicas=block.min_replicas,
        max_replicas=block.max_replicas,
        max_step_up=block.max_step.up,
        max_step_down=block.max_step.down,
        cooldown_up_s=block.cooldown.up,
        cooldown_down_s=block.cooldown.down,
        stabilization_up_s=block.stabilization.up,
        stabilization_down_s=block.stabilization.down,
    )
    panic = block.panic
    return AutoscaleConfig(
        service=service,
        algorithm=block.algorithm,
        metric=block.metric,
        sampling_interval_s=interval,
        limits=limits,
        panic=PanicConfig(
            enabled=panic.enabled,
            threshold=panic.threshold,
            window_s=panic.window,
            hold_s=panic.hold,
        ),
        params=_params(block),
        instance_type=block.instance_type,
    )


def _params(block: Autoscale) -> Params:
    if block.algorithm == "threshold":
        rule = block.threshold
        assert rule is not None and rule.threshold is not None  # the schema requires them
        return ThresholdParams(
            threshold=rule.threshold, step=rule.step, scale_in_threshold=rule.scale_in_threshold
        )
    assert block.target is not None  # the schema requires it for every other algorithm
    reactive = ProportionalParams(
        target=block.target,
        tolerance_up=block.tolerance.up,
        tolerance_down=block.tolerance.down,
        latency_guard_s=block.latency_guard,
        window_s=block.window if block.window is not None else block.sampling_interval,
        backlog_drain_s=block.backlog_drain,
    )
    if block.algorithm == "pid":
        pid = block.pid
        return PIDParams(
            target=block.target,
            kp=pid.kp,
            ki=pid.ki,
            kd=pid.kd,
            smoothing=pid.smoothing,
            integral_limit=pid.integral_limit,
            deadband=pid.deadband,
            window_s=reactive.window_s,
        )
    if block.algorithm == "predictive":
        p = block.predictive
        return PredictiveParams(
            reactive=reactive,
            horizon_s=p.horizon,
            bucket_s=p.bucket,
            season_s=p.season,
            alpha=p.alpha,
            beta=p.beta,
            gamma=p.gamma,
            phi=p.phi,
            max_error=p.max_error,
            error_window=p.error_window,
            headroom=p.headroom,
        )
    return reactive


def _from_rule(service: str, block: AutoscaleRule) -> AutoscaleConfig:
    rule = block.scaling_policy
    limits = Limits(
        min_replicas=block.min_size,
        max_replicas=block.max_size,
        max_step_up=rule.step,
        max_step_down=rule.step,
        cooldown_up_s=rule.cooldown,
        cooldown_down_s=rule.cooldown,
        stabilization_up_s=0.0,
        stabilization_down_s=0.0,
    )
    return AutoscaleConfig(
        service=service,
        algorithm="threshold",
        metric=rule.metric_type,
        sampling_interval_s=block.sampling_interval,
        limits=limits,
        panic=PanicConfig(enabled=False),
        params=ThresholdParams(
            threshold=rule.threshold, step=rule.step, scale_in_threshold=rule.scale_in_threshold
        ),
        instance_type=block.instance_type,
    )
