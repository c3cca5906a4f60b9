"""The ``autoscale:`` block of a service: its schema, in either of its two forms.

The native form names an algorithm and its settings; the issue's rule form is accepted in
exactly its published shape (a ``scaling_policy`` key selects it)::

    autoscale: {algorithm: proportional, metric: in_flight, target: 4, cooldown: {up: 15}}
    autoscale:
      scaling_policy: {metric_type: queue_length, threshold: 1000, action: add_instance,
                       cooldown: 300}
      min_size: 2
      max_size: 16

Each field's type and range is declared in :mod:`autoscale_fields`; the rules across fields
(min above max, a cooldown shorter than the sampling interval, what the chosen algorithm
needs and what it does not use) are checked here, inside the schema, so a block's problems
are reported together, each on its field, with the messages the autoscaler has always given.
The gateway compiles a validated block into the autoscaler's own types
(gateway/autoscale_policy.py); the controller never reads this module. ``scale_target``
(what a decision acts on) is :mod:`scale_target`'s; the rule across the service (a metric
only replicas the gateway runs can give) is checks_replicas.py's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from inferway.policies.autoscale_fields import (
    ADDITIVE_METRICS,
    Algorithm,
    Cooldown,
    Count,
    CountFromOne,
    MaxStep,
    Metric,
    OptionalPositive,
    PanicBlock,
    PidBlock,
    Positive,
    PredictiveBlock,
    ScalingPolicy,
    Stabilization,
    ThresholdBlock,
    Tolerance,
    number,
    pair,
    panic_off,
    step_limit,
    within_one,
)

__all__ = ["Autoscale", "AutoscaleBlock", "AutoscaleRule"]

Loc = tuple[str | int, ...]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _AllAtOnce(_Model):
    """A block whose cross-field rules (``issues``) are reported with its field errors: on
    a field error the rules still run on the fields that are valid (the others left out)."""

    def issues(self) -> Iterator[tuple[Loc, str]]:
        return iter(())

    @model_validator(mode="wrap")
    @classmethod
    def _all_at_once(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        errors: list[Any] = []
        try:
            block = handler(data)
        except ValidationError as error:
            errors = list(error.errors())
            block = _without_failed(data, [tuple(e["loc"]) for e in errors], handler)
        failed = [tuple(e["loc"]) for e in errors]
        rules = [
            (loc, message)
            for loc, message in (block.issues() if isinstance(block, _AllAtOnce) else ())
            if not any(_overlap(loc, bad) for bad in failed)
        ]
        if not rules and not errors:
            return block
        details: list[InitErrorDetails] = [*errors]
        for loc, message in rules:
            escaped = message.replace("{", "{{").replace("}", "}}")
            details.append(
                {"type": PydanticCustomError("value_error", escaped), "loc": loc, "input": None}
            )
        raise ValidationError.from_exception_data(cls.__name__, details)


_PLACEHOLDERS: dict[Loc, Any] = {
    ("scaling_policy", "metric_type"): "request_rate",
    ("scaling_policy", "action"): "add_instance",
    ("scaling_policy", "threshold"): float("inf"),
}
"""Stand-ins for required fields that failed, so the other rules still run: none of them
takes part in a rule (an infinite threshold is above any scale-in threshold)."""


def _overlap(a: Loc, b: Loc) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def _without_failed(
    data: Any, failed: list[Loc], handler: ValidatorFunctionWrapHandler
) -> Any | None:
    """The block validated with every field that had an error left out (its default
    taken, or its stand-in when it has none); None when even that fails."""
    if not isinstance(data, Mapping):
        return None
    pruned = _copy(data)
    for loc in failed:
        node: Any = pruned
        for part in loc[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and loc:
            node.pop(loc[-1], None)
    for (outer, key), value in _PLACEHOLDERS.items():
        inner = pruned.get(outer)
        if isinstance(inner, dict) and key not in inner:
            inner[key] = value
    try:
        return handler(pruned)
    except ValidationError:
        return None


def _copy(data: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


class Autoscale(_AllAtOnce):
    """The native form (docs/autoscaling.md). ``target`` is the metric per replica to hold
    (every algorithm but threshold needs it); ``window`` defaults to the sampling interval."""

    algorithm: Algorithm = "proportional"
    metric: Metric = "request_rate"
    target: OptionalPositive = None
    sampling_interval: Positive = 5.0
    min_replicas: Count = 1
    max_replicas: CountFromOne = 10
    max_step: Annotated[MaxStep, BeforeValidator(pair(step_limit))] = Field(default_factory=MaxStep)
    cooldown: Annotated[Cooldown, BeforeValidator(pair(number()))] = Field(default_factory=Cooldown)
    stabilization: Annotated[Stabilization, BeforeValidator(pair(number()))] = Field(
        default_factory=Stabilization
    )
    tolerance: Annotated[Tolerance, BeforeValidator(pair(within_one))] = Field(
        default_factory=Tolerance
    )
    latency_guard: OptionalPositive = None
    window: OptionalPositive = None
    backlog_drain: OptionalPositive = None
    panic: Annotated[PanicBlock, BeforeValidator(panic_off)] = Field(default_factory=PanicBlock)
    threshold: ThresholdBlock | None = None
    pid: PidBlock = Field(default_factory=PidBlock)
    predictive: PredictiveBlock = Field(default_factory=PredictiveBlock)
    instance_type: str | None = None
    scale_target: Any = None
    """What a decision acts on: read by scale_target.py, which checks it."""

    def issues(self) -> Iterator[tuple[Loc, str]]:
        interval = self.sampling_interval
        if self.min_replicas > self.max_replicas:
            yield (
                ("min_replicas",),
                f"min_replicas ({self.min_replicas}) is greater than max_replicas "
                f"({self.max_replicas})",
            )
        for direction, cooldown in (("up", self.cooldown.up), ("down", self.cooldown.down)):
            if 0 < cooldown < interval:
                yield (
                    ("cooldown", direction),
                    f"cooldown {cooldown:g} s is shorter than the sampling interval "
                    f"({interval:g} s): it could never be honoured (use 0 for none)",
                )
        if self.algorithm == "threshold":
            yield from self._threshold_issues()
            return
        if self.target is None:
            yield ("target",), f"required: the {self.metric} per replica to hold"
        if self.backlog_drain is not None and self.metric != "request_rate":
            yield (
                ("backlog_drain",),
                "only applies to metric request_rate (it adds queue_length / backlog_drain "
                "to the rate)",
            )
        if self.algorithm == "pid":
            for key in ("tolerance", "backlog_drain", "latency_guard"):
                if key in self.model_fields_set:
                    yield (key,), "not used by the pid algorithm (its noise band is pid.deadband)"
        if self.algorithm == "predictive":
            yield from self._predictive_issues()

    def _threshold_issues(self) -> Iterator[tuple[Loc, str]]:
        value = None if self.threshold is None else self.threshold.threshold
        if self.threshold is None or value is None:
            yield (
                ("threshold", "threshold"),
                "required: the metric value above which to scale out",
            )
            return
        below = self.threshold.scale_in_threshold
        if below is not None and below >= value:
            yield (
                ("threshold", "scale_in_threshold"),
                f"must be below threshold ({value:g}), got {below:g}",
            )

    def _predictive_issues(self) -> Iterator[tuple[Loc, str]]:
        if self.metric not in ADDITIVE_METRICS:
            yield (
                ("metric",),
                f"predictive needs a service-total metric ({', '.join(ADDITIVE_METRICS)}), "
                f"got {self.metric!r}",
            )
        p, interval = self.predictive, self.sampling_interval
        if p.bucket < interval:
            yield (
                ("predictive", "bucket"),
                f"bucket {p.bucket:g} s is shorter than the sampling interval ({interval:g} s)",
            )
        if p.season is not None and p.season < 2 * p.bucket:
            yield (
                ("predictive", "season"),
                f"season {p.season:g} s must hold at least two buckets of {p.bucket:g} s",
            )


class AutoscaleRule(_AllAtOnce):
    """The issue's rule form, in its published JSON/YAML shape."""

    scaling_policy: ScalingPolicy
    instance_type: str | None = None
    min_size: Count = 1
    max_size: CountFromOne = 10
    sampling_interval: Positive = 5.0
    scale_target: Any = None
    """What a decision acts on: read by scale_target.py, which checks it."""

    def issues(self) -> Iterator[tuple[Loc, str]]:
        policy, interval = self.scaling_policy, self.sampling_interval
        below = policy.scale_in_threshold
        if below is not None and below >= policy.threshold:
            yield (
                ("scaling_policy", "scale_in_threshold"),
                f"must be below threshold ({policy.threshold:g}), got {below:g}",
            )
        if 0 < policy.cooldown < interval:
            yield (
                ("scaling_policy", "cooldown"),
                f"cooldown {policy.cooldown:g} s is shorter than the sampling interval "
                f"({interval:g} s)",
            )
        if self.min_size > self.max_size:
            yield (
                ("min_size",),
                f"min_size ({self.min_size}) is greater than max_size ({self.max_size})",
            )


def _form(value: object) -> str:
    if isinstance(value, AutoscaleRule) or (
        isinstance(value, Mapping) and "scaling_policy" in value
    ):
        return "rule"
    return "native"


AutoscaleBlock = Annotated[
    Annotated[Autoscale, Tag("native")] | Annotated[AutoscaleRule, Tag("rule")],
    Discriminator(_form),
]
"""``services[].autoscale``: the rule form when it has ``scaling_policy``, else native."""
