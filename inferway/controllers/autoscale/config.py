"""Autoscaling configuration per service: user input validated into the ``params`` types.

``build_autoscale_config(service, mapping)`` reads the native form (a ``autoscale:`` block of
the policy, parsed YAML or JSON). Every problem is collected and raised at once as one
``AutoscaleConfigError`` naming each field, so a person fixes them all in one edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferway.controllers.autoscale.config_reader import AutoscaleConfigError, ConfigReader
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
from inferway.controllers.autoscale.samples import ADDITIVE_METRICS, METRICS

__all__ = ["ALGORITHMS", "build_autoscale_config"]

ALGORITHMS = ("threshold", "proportional", "pid", "predictive")


_TOP_KEYS = {
    "algorithm",
    "metric",
    "target",
    "sampling_interval",
    "min_replicas",
    "max_replicas",
    "max_step",
    "cooldown",
    "stabilization",
    "tolerance",
    "latency_guard",
    "window",
    "backlog_drain",
    "panic",
    "threshold",
    "pid",
    "predictive",
    "instance_type",
}


def build_autoscale_config(service: str, data: Mapping[str, Any]) -> AutoscaleConfig:
    """Validate the native form and return the config; raises AutoscaleConfigError."""
    r = ConfigReader(f"services.{service}.autoscale")
    data = r.mapping(data, "", _TOP_KEYS)
    algorithm = data.get("algorithm", "proportional")
    if algorithm not in ALGORITHMS:
        r.fail(
            "algorithm", f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    metric = data.get("metric", "request_rate")
    if metric not in METRICS:
        r.fail("metric", f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    interval = r.number(data, "sampling_interval", 5.0, positive=True) or 5.0
    limits = _build_limits(r, data, interval)
    panic = _build_panic(r, data.get("panic", {}), interval)
    params = _build_params(r, data, algorithm, metric, interval)
    instance_type = data.get("instance_type")
    if instance_type is not None and not isinstance(instance_type, str):
        r.fail("instance_type", f"expected a string, got {instance_type!r}")
    if r.problems:
        raise AutoscaleConfigError(r.problems)
    assert params is not None
    return AutoscaleConfig(
        service=service,
        algorithm=algorithm,
        metric=metric,
        sampling_interval_s=interval,
        limits=limits,
        panic=panic,
        params=params,
        instance_type=instance_type,
        source=dict(data),
    )


def _build_limits(r: ConfigReader, data: Mapping[str, Any], interval: float) -> Limits:
    d = Limits()
    lo = r.integer(data, "min_replicas", d.min_replicas)
    hi = r.integer(data, "max_replicas", d.max_replicas, minimum=1)
    lo, hi = lo if lo is not None else d.min_replicas, hi if hi is not None else d.max_replicas
    if lo > hi:
        r.fail("min_replicas", f"min_replicas ({lo}) is greater than max_replicas ({hi})")
    step_up, step_down = r.pair(data, "max_step", (None, None), integer=True)
    for name, step in (("max_step.up", step_up), ("max_step.down", step_down)):
        if step is not None and step < 1:
            r.fail(name, f"must be >= 1 (leave it out for no limit), got {step}")
    cd_up, cd_down = r.pair(data, "cooldown", (d.cooldown_up_s, d.cooldown_down_s), False)
    for name, cooldown in (("cooldown.up", cd_up), ("cooldown.down", cd_down)):
        if 0 < cooldown < interval:
            r.fail(
                name,
                f"cooldown {cooldown:g} s is shorter than the sampling interval "
                f"({interval:g} s): it could never be honoured (use 0 for none)",
            )
    st_up, st_down = r.pair(
        data, "stabilization", (d.stabilization_up_s, d.stabilization_down_s), False
    )
    return Limits(
        min_replicas=lo,
        max_replicas=hi,
        max_step_up=step_up,
        max_step_down=step_down,
        cooldown_up_s=cd_up,
        cooldown_down_s=cd_down,
        stabilization_up_s=st_up,
        stabilization_down_s=st_down,
    )


def _build_panic(r: ConfigReader, data: Any, interval: float) -> PanicConfig:
    if data is False:
        return PanicConfig(enabled=False)
    part = r.mapping(data, "panic", {"enabled", "threshold", "window", "hold"})
    d = PanicConfig()
    enabled = part.get("enabled", True)
    if not isinstance(enabled, bool):
        r.fail("panic.enabled", f"expected true or false, got {enabled!r}")
        enabled = True
    return PanicConfig(
        enabled=enabled,
        threshold=r.number(part, "threshold", d.threshold, name="panic.threshold", minimum=1.0)
        or d.threshold,
        window_s=r.number(part, "window", d.window_s, name="panic.window", positive=True)
        or d.window_s,
        hold_s=r.number(part, "hold", d.hold_s, name="panic.hold") or 0.0,
    )


def _build_reactive(
    r: ConfigReader, data: Mapping[str, Any], metric: str, interval: float
) -> ProportionalParams | None:
    target = r.number(data, "target", None, positive=True)
    if target is None and "target" not in data:
        r.fail("target", f"required: the {metric} per replica to hold")
    drain = r.number(data, "backlog_drain", None, positive=True)
    if drain is not None and metric != "request_rate":
        r.fail(
            "backlog_drain",
            "only applies to metric request_rate (it adds queue_length "
            "/ backlog_drain to the rate)",
        )
    window = r.number(data, "window", interval, positive=True) or interval
    tol_up, tol_down = r.pair(data, "tolerance", (0.1, 0.1), False)
    for name, tol in (("tolerance.up", tol_up), ("tolerance.down", tol_down)):
        if tol > 1.0:
            r.fail(name, f"must be <= 1.0, got {tol:g}")
    if target is None:
        return None
    return ProportionalParams(
        target=target,
        tolerance_up=tol_up,
        tolerance_down=tol_down,
        window_s=window,
        backlog_drain_s=drain,
        latency_guard_s=r.number(data, "latency_guard", None, positive=True),
    )


def _build_params(
    r: ConfigReader, data: Mapping[str, Any], algorithm: str, metric: str, interval: float
) -> Params | None:
    if algorithm == "threshold":
        part = r.mapping(
            data.get("threshold"), "threshold", {"threshold", "step", "scale_in_threshold"}
        )
        value = r.number(part, "threshold", None, name="threshold.threshold")
        if value is None:
            r.fail("threshold.threshold", "required: the metric value above which to scale out")
            return None
        below = r.number(part, "scale_in_threshold", None, name="threshold.scale_in_threshold")
        if below is not None and below >= value:
            r.fail(
                "threshold.scale_in_threshold",
                f"must be below threshold ({value:g}), got {below:g}",
            )
        step = r.integer(part, "step", 1, name="threshold.step", minimum=1) or 1
        return ThresholdParams(threshold=value, step=step, scale_in_threshold=below)
    reactive = _build_reactive(r, data, metric, interval)
    if reactive is None:
        return None
    if algorithm == "pid":
        for key in ("tolerance", "backlog_drain", "latency_guard"):
            if key in data:
                r.fail(key, "not used by the pid algorithm (its noise band is pid.deadband)")
        part = r.mapping(
            data.get("pid", {}),
            "pid",
            {"kp", "ki", "kd", "smoothing", "integral_limit", "deadband"},
        )
        d = PIDParams(target=reactive.target)
        return PIDParams(
            target=reactive.target,
            kp=r.number(part, "kp", d.kp, name="pid.kp"),
            ki=r.number(part, "ki", d.ki, name="pid.ki"),
            kd=r.number(part, "kd", d.kd, name="pid.kd"),
            smoothing=r.number(
                part, "smoothing", d.smoothing, name="pid.smoothing", positive=True, maximum=1.0
            ),
            integral_limit=r.number(
                part, "integral_limit", d.integral_limit, name="pid.integral_limit", positive=True
            ),
            deadband=r.number(part, "deadband", d.deadband, name="pid.deadband", maximum=1.0),
            window_s=reactive.window_s,
        )
    if algorithm == "predictive":
        if metric not in ADDITIVE_METRICS:
            r.fail(
                "metric",
                f"predictive needs a service-total metric "
                f"({', '.join(ADDITIVE_METRICS)}), got {metric!r}",
            )
        return _build_predictive(r, data.get("predictive", {}), reactive, interval)
    return reactive


def _build_predictive(
    r: ConfigReader, data: Any, reactive: ProportionalParams, interval: float
) -> PredictiveParams:
    part = r.mapping(
        data,
        "predictive",
        {
            "horizon",
            "bucket",
            "season",
            "alpha",
            "beta",
            "gamma",
            "phi",
            "max_error",
            "error_window",
            "headroom",
        },
    )
    d = PredictiveParams(reactive=reactive)

    def unit(key: str, default: float) -> float:
        value = r.number(part, key, default, name=f"predictive.{key}", maximum=1.0)
        return default if value is None else value

    bucket = r.number(part, "bucket", d.bucket_s, name="predictive.bucket", positive=True)
    bucket = bucket or d.bucket_s
    if bucket < interval:
        r.fail(
            "predictive.bucket",
            f"bucket {bucket:g} s is shorter than the sampling interval ({interval:g} s)",
        )
    season = r.number(part, "season", d.season_s, name="predictive.season", positive=True)
    if season is not None and season < 2 * bucket:
        r.fail(
            "predictive.season",
            f"season {season:g} s must hold at least two buckets of {bucket:g} s",
        )
    return PredictiveParams(
        reactive=reactive,
        horizon_s=r.number(part, "horizon", d.horizon_s, name="predictive.horizon", positive=True)
        or d.horizon_s,
        bucket_s=bucket,
        season_s=season,
        alpha=unit("alpha", d.alpha),
        beta=unit("beta", d.beta),
        gamma=unit("gamma", d.gamma),
        phi=unit("phi", d.phi),
        max_error=r.number(
            part, "max_error", d.max_error, name="predictive.max_error", positive=True
        )
        or d.max_error,
        error_window=r.integer(
            part, "error_window", d.error_window, name="predictive.error_window", minimum=1
        )
        or d.error_window,
        headroom=r.number(part, "headroom", d.headroom, name="predictive.headroom", minimum=1.0)
        or d.headroom,
    )
