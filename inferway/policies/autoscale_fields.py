"""The field types of the ``autoscale:`` block (autoscale.py): numbers, counts, the
per-direction pairs and the algorithms' sub-blocks.

Numbers are plain numbers (seconds for times): a boolean or a string is refused rather than
coerced, with the message the autoscaler has always given (``expected a number, got 'many'``,
``must be > 0.0, got -1``), so a field's own range is checked where its type is declared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

__all__ = [
    "ADDITIVE_METRICS",
    "ALGORITHMS",
    "BACKEND_METRICS",
    "METRICS",
    "Algorithm",
    "AtLeastOne",
    "AutoscaleMetric",
    "Cooldown",
    "Count",
    "CountFromOne",
    "MaxStep",
    "Metric",
    "Number",
    "OptionalNumber",
    "OptionalPositive",
    "PanicBlock",
    "PidBlock",
    "Positive",
    "PredictiveBlock",
    "ScalingPolicy",
    "Stabilization",
    "ThresholdBlock",
    "Tolerance",
    "integer",
    "number",
    "pair",
    "panic_off",
    "step_limit",
    "within_one",
]

ADDITIVE_METRICS = ("queue_length", "in_flight", "request_rate", "token_rate")
"""Metrics summed over the service (the autoscaler divides them by the target); ``token_rate``
is the LLM tokens per second the gateway counted for the service."""
METRICS = (*ADDITIVE_METRICS, "utilization", "p99_latency", "queue_wait")
"""Every metric the autoscaler reads (controllers/autoscale/samples.py; a test keeps them
equal)."""
BACKEND_METRICS = ("queue_length", "utilization", "queue_wait")
"""Read from each replica's ``/metrics``: only the gateway's own replicas give them."""
ALGORITHMS = ("threshold", "proportional", "pid", "predictive")

AutoscaleMetric = Literal[
    "queue_length",
    "in_flight",
    "request_rate",
    "token_rate",
    "utilization",
    "p99_latency",
    "queue_wait",
]


_LARGEST_NUMBER = 1e300
"""An integer larger than this cannot be taken as a float (the autoscaler's numbers are)."""


def number(
    *, minimum: float = 0.0, positive: bool = False, maximum: float | None = None
) -> Callable[[object], object]:
    def check(value: object) -> object:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if isinstance(value, int) and abs(value) > _LARGEST_NUMBER:
            raise ValueError(
                f"expected a number at most {_LARGEST_NUMBER:.0e}, got {len(str(value))} digits"
            )
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        if (
            (positive and value <= 0)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            bound = f"> {minimum}" if positive else f">= {minimum}"
            bound += f" and <= {maximum}" if maximum is not None else ""
            raise ValueError(f"must be {bound}, got {value}")
        return float(value)

    return check


def integer(*, minimum: int = 0) -> Callable[[object], object]:
    def check(value: object) -> object:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")
        return value

    return check


def step_limit(value: object) -> object:
    value = integer()(value)
    if isinstance(value, int) and value < 1:
        raise ValueError(f"must be >= 1 (leave it out for no limit), got {value}")
    return value


def within_one(value: object) -> object:
    value = number()(value)
    if isinstance(value, float) and value > 1.0:
        raise ValueError(f"must be <= 1.0, got {value:g}")
    return value


def _one_of(what: str, allowed: tuple[str, ...], hint: str | None = None) -> Callable[..., Any]:
    def check(value: object) -> object:
        if value not in allowed:
            expected = hint or f"one of {', '.join(allowed)}"
            raise ValueError(f"unknown {what} {value!r}; expected {expected}")
        return value

    return check


def _boolean(value: object) -> object:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


Number = Annotated[float, BeforeValidator(number())]
Positive = Annotated[float, BeforeValidator(number(positive=True))]
Unit = Annotated[float, BeforeValidator(number(maximum=1.0))]
AtLeastOne = Annotated[float, BeforeValidator(number(minimum=1.0))]
OptionalNumber = Annotated[float | None, BeforeValidator(number())]
OptionalPositive = Annotated[float | None, BeforeValidator(number(positive=True))]
Count = Annotated[int, BeforeValidator(integer())]
CountFromOne = Annotated[int, BeforeValidator(integer(minimum=1))]
Metric = Annotated[AutoscaleMetric, BeforeValidator(_one_of("metric", METRICS))]
Algorithm = Annotated[
    Literal["threshold", "proportional", "pid", "predictive"],
    BeforeValidator(_one_of("algorithm", ALGORITHMS)),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def pair(check: Callable[[object], object]) -> Callable[[object], object]:
    """``key: N`` means N in both directions; ``key: {up: N, down: M}`` each its own."""

    def expand(value: object) -> object:
        if value is None:
            return {}
        if isinstance(value, Mapping | BaseModel):
            return value
        both = check(value)
        return {"up": both, "down": both}

    return expand


class Cooldown(_Model):
    """Seconds after a scale-out (``up``) or any scaling (``down``) before the next one."""

    up: Number = 0.0
    down: Number = 300.0


class Stabilization(_Model):
    """HPA's windows: the lowest (up) or highest (down) recommendation of that many seconds."""

    up: Number = 0.0
    down: Number = 300.0


class Tolerance(_Model):
    """The band around the current count within which a recommendation holds."""

    up: Annotated[float, BeforeValidator(within_one)] = 0.1
    down: Annotated[float, BeforeValidator(within_one)] = 0.1


class MaxStep(_Model):
    """At most this many replicas per decision (None: no limit)."""

    up: Annotated[int | None, BeforeValidator(step_limit)] = None
    down: Annotated[int | None, BeforeValidator(step_limit)] = None


def panic_off(value: object) -> object:
    return {"enabled": False} if value is False else value


class PanicBlock(_Model):
    """Knative-style panic (controllers/autoscale/params.py ``PanicConfig``); ``panic:
    false`` turns it off."""

    enabled: Annotated[bool, BeforeValidator(_boolean)] = True
    threshold: AtLeastOne = 2.0
    window: Positive = 6.0
    hold: Number = 60.0


class ThresholdBlock(_Model):
    """``algorithm: threshold``: above ``threshold`` add ``step``; below
    ``scale_in_threshold`` (when set) remove ``step``."""

    threshold: OptionalNumber = None
    step: CountFromOne = 1
    scale_in_threshold: OptionalNumber = None


class PidBlock(_Model):
    """``algorithm: pid``: gains, output smoothing, integral bound and noise band."""

    kp: Number = 0.8
    ki: Number = 0.01
    kd: Number = 0.0
    smoothing: Annotated[float, BeforeValidator(number(positive=True, maximum=1.0))] = 0.5
    integral_limit: Positive = 10.0
    deadband: Unit = 0.1


class PredictiveBlock(_Model):
    """``algorithm: predictive``: Holt-Winters on ``bucket`` means, looking ``horizon``
    ahead; ``season: null`` for a series without a daily pattern."""

    horizon: Positive = 300.0
    bucket: Positive = 60.0
    season: OptionalPositive = 86400.0
    alpha: Unit = 0.3
    beta: Unit = 0.02
    gamma: Unit = 0.3
    phi: Unit = 0.95
    max_error: Positive = 0.2
    error_window: CountFromOne = 30
    headroom: AtLeastOne = 1.0


class ScalingPolicy(_Model):
    """The issue's rule: above ``threshold`` of ``metric_type`` add one instance, then wait
    ``cooldown`` seconds; ``scale_in_threshold`` and ``step`` are this project's additions."""

    metric_type: Metric
    threshold: Number
    action: Annotated[
        Literal["add_instance"],
        BeforeValidator(_one_of("action", ("add_instance",), "add_instance")),
    ]
    cooldown: Number = 300.0
    scale_in_threshold: OptionalNumber = None
    step: CountFromOne = 1
