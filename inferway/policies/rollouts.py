"""The ``rollouts:`` section: progressive delivery of a canary on one route (issue 13).

A rollout moves a route's weight from ``stable`` to ``canary`` through ``steps`` while the
analysis compares the two over the same windows. What it decides is written into the
runtime State as a weight override, never into this file, so the policy stays what the user
wrote. Percentages are written as numbers (``0.5``) or strings with a sign (``"0.5%"``); both
mean percent.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from inferway.policies.rollout_prometheus import PrometheusAnalysis
from inferway.policies.traffic import HashOn
from inferway.policies.types import Duration, Name

__all__ = [
    "METRIC_NEEDS",
    "CanaryHeader",
    "Percent",
    "Rollout",
    "RolloutAnalysis",
    "RolloutMatch",
    "RolloutMetric",
    "RolloutMetricName",
    "RolloutStep",
    "RolloutWebhook",
    "parse_percent",
]

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_percent(value: object) -> object:
    """``"0.5%"`` / ``0.5`` -> ``0.5`` (percent); the rest is left to pydantic."""
    if isinstance(value, bool):
        raise ValueError("expected a percentage such as 0.5 or '0.5%', not a boolean")
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if not match:
            raise ValueError(f"expected a percentage such as 0.5 or '0.5%', got {value!r}")
        return float(match.group(1))
    return value


Percent = Annotated[float, BeforeValidator(parse_percent), Field(ge=0, le=100)]
"""Percent as a float (``0.5`` is half a percent)."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


def _step_item(value: object) -> object:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return {"weight": value}
    return value


class RolloutStep(_Model):
    """The canary's weight at one step (percent, 0.1 resolution), held at least ``pause``
    (and one analysis interval) and left only when the analysis passes."""

    weight: Percent
    pause: Duration = 0.0

    @model_validator(mode="after")
    def _resolution(self) -> RolloutStep:
        tenths = self.weight * 10
        if abs(tenths - round(tenths)) > 1e-6 or self.weight <= 0:
            raise ValueError(
                f"step weight must be above 0 with 0.1% resolution (e.g. 0.1, 5, 100), "
                f"got {self.weight:g}"
            )
        return self


RolloutMetricName = Literal[
    "error-rate",
    "latency-p99",
    "backend-error-rate",
    "backend-latency-p99",
    "output-agreement",
    "latency-quantile",
    "error-rate-max",
    "ttft",
    "itl",
]
"""The metrics a rollout compares or guards on; the rollout controller's own list
(``controllers.rollout.config.MetricName``, a layer this one may not import) is kept equal to
this one by a test."""

METRIC_NEEDS: dict[str, str] = {
    "error-rate": "max_increase",
    "latency-p99": "max_increase",
    "backend-error-rate": "max_increase",
    "backend-latency-p99": "max_increase",
    "output-agreement": "min",
    "latency-quantile": "max_ms",
    "error-rate-max": "max",
    "ttft": "max_increase",
    "itl": "max_increase",
}
"""Each metric's one limit field."""


class RolloutMetric(_Model):
    """One comparison of canary against stable: ``error-rate`` (``max_increase`` in
    percentage points), ``latency-p99`` (``max_increase`` relative), ``output-agreement``
    (``min``: the share of mirrored requests whose canary answer matches stable's, ``via:
    mirror``), or an absolute guard on the canary alone (``latency-quantile`` with ``max_ms``,
    ``error-rate-max`` with ``max``). ``backend-error-rate`` and ``backend-latency-p99`` are
    the first two on the backends' own metrics (their ``/metrics``, scraped by the gateway).
    ``ttft`` and ``itl`` (``max_increase`` relative) compare the time to first token and per
    output token of streamed LLM answers, from the gateway's ``gen_ai_server_*`` histograms
    as Prometheus scrapes them (``source: prometheus``)."""

    name: RolloutMetricName
    max_increase: Percent | None = None
    max: Percent | None = None
    max_ms: float | None = Field(default=None, gt=0)
    min: Percent | None = None
    quantile: float = Field(default=0.99, gt=0, lt=1)
    via: Literal["mirror"] | None = None

    @model_validator(mode="after")
    def _fields(self) -> RolloutMetric:
        needs = METRIC_NEEDS[self.name]
        given = [
            k for k in ("max_increase", "max", "max_ms", "min") if getattr(self, k) is not None
        ]
        if given != [needs]:
            raise ValueError(
                f"metric {self.name} takes exactly '{needs}' (got {', '.join(given) or 'none'})"
            )
        value = getattr(self, needs)
        if value <= 0:
            raise ValueError(f"metric {self.name}: {needs} must be above 0, got {value:g}")
        if (self.via is not None) != (self.name == "output-agreement"):
            raise ValueError(
                "output-agreement needs 'via: mirror' (answers of mirrored requests); "
                "no other metric takes 'via'"
            )
        if self.name == "output-agreement" and value >= 100:
            raise ValueError("output-agreement min must be below 100% (some tolerance)")
        return self


def _default_metrics() -> list[RolloutMetric]:
    return [
        RolloutMetric(name="error-rate", max_increase=0.5),
        RolloutMetric(name="latency-p99", max_increase=20.0),
    ]


class RolloutAnalysis(_Model):
    """How often to judge and what: canary vs stable over the same windows, from Envoy's
    own per-cluster stats (``source: envoy``) or PromQL against a Prometheus that scrapes
    Envoy (``source: prometheus`` with its ``prometheus:`` settings); ``backend-*`` metrics
    are scraped from the backends' ``/metrics`` by the gateway with either source."""

    interval: Duration = 30.0
    min_requests: Literal["auto"] | Annotated[int, Field(ge=1)] = "auto"
    metrics: list[RolloutMetric] = Field(default_factory=_default_metrics, min_length=1)
    source: Literal["envoy", "prometheus"] = "envoy"
    prometheus: PrometheusAnalysis | None = None

    @model_validator(mode="after")
    def _source_settings(self) -> RolloutAnalysis:
        if self.source == "prometheus" and self.prometheus is None:
            raise ValueError("source: prometheus needs 'prometheus: {url: ...}'")
        if self.source != "prometheus" and self.prometheus is not None:
            raise ValueError("'prometheus:' settings are used only with source: prometheus")
        llm = [m.name for m in self.metrics if m.name in ("ttft", "itl")]
        if llm and self.source != "prometheus":
            raise ValueError(
                f"metric {llm[0]} needs source: prometheus (the gateway's "
                "gen_ai_server_* histograms as Prometheus scrapes them); Envoy's own stats "
                "have no time to first token"
            )
        return self


class CanaryHeader(_Model):
    """One request header that sends a request to the canary: exactly one of exact, prefix
    or present (its own small type: model.py imports this module, not the other way)."""

    name: str = Field(min_length=1)
    exact: str | None = None
    prefix: str | None = None
    present: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> CanaryHeader:
        given = [k for k in ("exact", "prefix", "present") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of exact, prefix or present (got {', '.join(given) or 'none'})"
            )
        return self


class RolloutMatch(_Model):
    """Requests with all of these headers always go to the canary (testers, while it rolls)."""

    headers: list[CanaryHeader] = Field(min_length=1)


class RolloutWebhook(_Model):
    """A URL the rollout POSTs JSON to. ``pre-step`` is a gate: before each step (and the
    promotion) it must answer 2xx, else the step waits (the evidence keeps accumulating);
    ``post-rollout`` (promoted) and ``rollback`` (rolled back or aborted) are notifications.
    Each call gives up after ``timeout`` and is tried ``retries`` more times."""

    type: Literal["pre-step", "post-rollout", "rollback"]
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$")]
    timeout: Duration = 5.0
    retries: int = Field(default=2, ge=0, le=10)


class Rollout(_Model):
    """One canary rollout on one route."""

    name: Name
    route: str
    stable: str
    canary: str
    steps: list[Annotated[RolloutStep, BeforeValidator(_step_item)]] = Field(min_length=1)
    analysis: RolloutAnalysis = Field(default_factory=RolloutAnalysis)
    on_failure: Literal["rollback", "pause"] = "rollback"
    match: list[RolloutMatch] = Field(default_factory=list)
    webhooks: list[RolloutWebhook] = Field(default_factory=list)
    sticky: HashOn | None = None
    """A user stays on one version while the canary grows: the route's ``hash`` (header,
    cookie or client IP), set here so it travels with the rollout; resolve gives the route
    this hash policy (``use_hash_policy``), and a route with a different ``hash`` is refused."""
