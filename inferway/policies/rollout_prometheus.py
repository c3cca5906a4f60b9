"""``analysis.prometheus``: a rollout's windows from PromQL against a real Prometheus, as
Flagger does, for users whose Prometheus already scrapes Envoy (and keeps history).

One query per number, each run once for the stable and once for the canary. A query is
PromQL with two placeholders: ``{cluster}`` (the version's Envoy cluster name, so canary and
stable read the same series by ``envoy_cluster_name``) and ``{interval}`` (the analysis
interval as a Prometheus duration, written as the range ``[{interval}]``). Only those two
bare-word braces are placeholders; PromQL's own label matchers (``{name="value"}``) are left
alone, so templates need no escaping. The defaults read the series Envoy's admin
``/stats/prometheus`` exposes, so a Prometheus that scrapes Envoy needs nothing else.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DEFAULT_QUERIES",
    "PLACEHOLDERS",
    "SECONDS_QUERIES",
    "PrometheusAnalysis",
    "PrometheusQueries",
    "promql_duration",
    "render_query",
]

PLACEHOLDERS = ("cluster", "interval")
_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _counted_from_zero(selector: str) -> str:
    """``increase()`` over the window of every series ``selector`` picks, where a series that
    appeared inside the window counts with its whole value. Envoy creates a response-class
    counter with its first such response and exposes a histogram only once it holds samples,
    and ``increase()`` of a series that appeared in the window misses its first value: all of
    it when the series first shows up already holding every request of the window."""
    return (
        f"(increase({selector}[{{interval}}]) and {selector} offset {{interval}})"
        f" or ({selector} unless {selector} offset {{interval}})"
    )


DEFAULT_QUERIES = {
    "requests": (
        'sum(increase(envoy_cluster_upstream_rq_completed{envoy_cluster_name="{cluster}"}'
        "[{interval}]))"
    ),
    "errors": "sum("
    + _counted_from_zero(
        'envoy_cluster_upstream_rq_xx{envoy_cluster_name="{cluster}",envoy_response_code_class="5"}'
    )
    + ")",
    "latency": "sum by (le) ("
    + _counted_from_zero('envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="{cluster}"}')
    + ")",
    "ttft": "sum by (le) ("
    + _counted_from_zero('gen_ai_server_time_to_first_token_seconds_bucket{backend="{cluster}"}')
    + ")",
    "itl": "sum by (le) ("
    + _counted_from_zero('gen_ai_server_time_per_output_token_seconds_bucket{backend="{cluster}"}')
    + ")",
}
"""What each query means: ``requests`` completed and ``errors`` (5xx class) in the window,
one number each; ``latency``: cumulative histogram buckets in ms, one series per ``le``;
``ttft`` and ``itl`` (asked only for a rollout with those metrics): the gateway's time to
first token and per output token of streamed answers, cumulative buckets in seconds."""

SECONDS_QUERIES = ("ttft", "itl")
"""Queries whose buckets are in seconds (the gen_ai conventions), not Envoy's ms."""


def _check_template(template: str) -> str:
    """Refuses a template whose placeholders could not be filled or that would read the
    same series for both versions."""
    if not template.strip():
        raise ValueError("query is empty")
    unknown = sorted({m for m in _PLACEHOLDER.findall(template) if m not in PLACEHOLDERS})
    if unknown:
        raise ValueError(
            f"unknown placeholder {', '.join('{' + u + '}' for u in unknown)} "
            f"(known: {{cluster}}, {{interval}})"
        )
    if "{cluster}" not in template:
        raise ValueError(
            'query must select the version by {cluster} (e.g. envoy_cluster_name="{cluster}"), '
            "else canary and stable read the same series"
        )
    return template


Template = Annotated[str, Field(min_length=1)]


class PrometheusQueries(BaseModel):
    """PromQL per number (unset ones keep :data:`DEFAULT_QUERIES`)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    requests: Template = DEFAULT_QUERIES["requests"]
    errors: Template = DEFAULT_QUERIES["errors"]
    latency: Template = DEFAULT_QUERIES["latency"]
    ttft: Template = DEFAULT_QUERIES["ttft"]
    itl: Template = DEFAULT_QUERIES["itl"]

    _templates = field_validator("requests", "errors", "latency", "ttft", "itl")(_check_template)


class PrometheusAnalysis(BaseModel):
    """Where Prometheus answers (its HTTP API base URL) and what to ask it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    url: str
    queries: PrometheusQueries = Field(default_factory=PrometheusQueries)
    timeout: Annotated[float, Field(gt=0, le=60)] = 5.0

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not _URL.match(url):
            raise ValueError(
                f"expected Prometheus' base URL such as http://prometheus:9090, got {url!r}"
            )
        return url


def promql_duration(seconds: float) -> str:
    """``30.0`` -> ``"30s"``, ``1.5`` -> ``"1500ms"`` (PromQL durations take no fractions)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"a PromQL range must be positive, got {seconds:g}s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def render_query(template: str, *, cluster: str, interval_s: float) -> str:
    """``template`` with its placeholders filled (the cluster name is quoted for a PromQL
    string: a backslash or quote in it cannot end the label matcher)."""
    values = {
        "cluster": cluster.replace("\\", "\\\\").replace('"', '\\"'),
        "interval": promql_duration(interval_s),
    }
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
