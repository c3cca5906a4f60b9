"""The Prometheus metric source's pure parts: the policy's PromQL templates (filled, and
refused with file:line when they cannot be), and Prometheus answers -> window counts."""

from __future__ import annotations

import math

import pytest

from inferway.gateway.rollouts.config import build_rollout_config
from inferway.gateway.rollouts.envoy_stats import EnvoyStatsSource, ScrapeError
from inferway.gateway.rollouts.prometheus_source import PrometheusSource, version_counts
from inferway.gateway.rollouts.sample_source import build_rollout_source
from inferway.policies import PolicyError, load_policy_text
from inferway.policies.rollout_prometheus import (
    DEFAULT_QUERIES,
    PrometheusAnalysis,
    promql_duration,
    render_query,
)
from inferway.state import State
from tests.rollout_samples import TWO_VERSION_ROLLOUT

POLICY = (
    TWO_VERSION_ROLLOUT
    + """    steps: [1, 100]
    analysis:
      interval: 30s
      source: prometheus
      prometheus:
        url: http://127.0.0.1:9090
        queries:
          requests: sum(increase(my_requests{svc="{cluster}"}[{interval}]))
"""
)


def test_templates_fill_the_cluster_and_the_window_and_leave_label_matchers_alone() -> None:
    query = render_query(DEFAULT_QUERIES["requests"], cluster="model-v2", interval_s=30)
    assert query == (
        'sum(increase(envoy_cluster_upstream_rq_completed{envoy_cluster_name="model-v2"}[30s]))'
    )
    latency = render_query(DEFAULT_QUERIES["latency"], cluster="v1", interval_s=1.5)
    bucket = 'envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="v1"}'
    assert latency == (  # a histogram that appeared inside the window counts whole
        f"sum by (le) ((increase({bucket}[1500ms]) and {bucket} offset 1500ms)"
        f" or ({bucket} unless {bucket} offset 1500ms))"
    )
    assert 'envoy_response_code_class="5"' in DEFAULT_QUERIES["errors"]
    # A quote in a name cannot end the PromQL string early.
    assert render_query('x{a="{cluster}"}', cluster='a"b', interval_s=1) == 'x{a="a\\"b"}'


@pytest.mark.parametrize(("seconds", "text"), [(30, "30s"), (600, "600s"), (0.25, "250ms")])
def test_windows_are_promql_durations(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


def test_the_policy_keeps_defaults_for_queries_it_does_not_set() -> None:
    rollout = load_policy_text(POLICY, "p.yaml").rollouts[0]
    settings = rollout.analysis.prometheus
    assert settings is not None and settings.url == "http://127.0.0.1:9090"
    assert settings.queries.requests == 'sum(increase(my_requests{svc="{cluster}"}[{interval}]))'
    assert settings.queries.errors == DEFAULT_QUERIES["errors"]
    source = PrometheusSource(settings, stable="v1", canary="v2", interval_s=30)
    assert source.queries("v2")["requests"] == 'sum(increase(my_requests{svc="v2"}[30s]))'


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "url: http://127.0.0.1:9090",
            "url: 127.0.0.1:9090",
            "p.yaml:19:14: rollouts[0].analysis.prometheus.url: expected Prometheus' base URL",
        ),
        (
            "[{interval}]",
            "[{window}]",
            "p.yaml:21:21: rollouts[0].analysis.prometheus.queries.requests: "
            "unknown placeholder {window}",
        ),
        (
            'svc="{cluster}"',
            'svc="v2"',
            "rollouts[0].analysis.prometheus.queries.requests: query must select the version "
            "by {cluster}",
        ),
        (
            "source: prometheus",
            "source: envoy",
            "rollouts[0].analysis: 'prometheus:' settings are used only with source: prometheus",
        ),
        (
            "requests:",
            "request:",
            "p.yaml:21:11: rollouts[0].analysis.prometheus.queries.request: unknown key",
        ),
    ],
)
def test_bad_prometheus_settings_are_refused_with_file_and_line(
    old: str, new: str, expected: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(POLICY.replace(old, new), "p.yaml")
    assert expected in str(caught.value), str(caught.value)


def test_source_prometheus_without_its_settings_is_refused() -> None:
    text = POLICY.split("      prometheus:")[0]
    with pytest.raises(PolicyError, match=r"source: prometheus needs 'prometheus: \{url"):
        load_policy_text(text, "p.yaml")


def test_the_rollout_source_is_picked_by_analysis_source() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    config = build_rollout_config(policy.rollouts[0])
    picked = build_rollout_source(config, policy, State(), lambda: None)
    assert isinstance(picked.stats, PrometheusSource)
    assert picked.stats.interval_s == 30 and picked.stats.canary == "v2"
    envoy = load_policy_text(POLICY.split("      source:")[0], "p.yaml")
    picked = build_rollout_source(
        build_rollout_config(envoy.rollouts[0]), envoy, State(), lambda: None
    )
    assert isinstance(picked.stats, EnvoyStatsSource)


def _sample(value: float, **metric: str) -> dict[str, object]:
    return {"metric": metric, "value": [1700000000.0, str(value)]}


def test_answers_become_counts_rounded_with_bucket_counts_from_cumulative_buckets() -> None:
    counts = version_counts(
        {
            "requests": [_sample(41.6)],
            "errors": [_sample(2.2)],
            "latency": [
                _sample(10.1, le="5"),
                _sample(30.4, le="25"),
                _sample(29.9, le="50"),  # extrapolation wobble: never a negative bucket
                _sample(41.6, le="+Inf"),
            ],
        },
        version="canary",
    )
    assert (counts.requests, counts.errors) == (42, 2)
    assert counts.latency_ms == {5.0: 10, 25.0: 20, 100.0: 12}  # +Inf -> twice 50 ms


def test_missing_error_and_latency_series_mean_none_but_missing_requests_is_an_error() -> None:
    counts = version_counts({"requests": [_sample(0)], "errors": [], "latency": []}, version="x")
    assert (counts.requests, counts.errors, counts.latency_ms) == (0, 0, {})
    with pytest.raises(ScrapeError, match="no requests series for canary 'v2'"):
        version_counts({"requests": [], "errors": [], "latency": []}, version="canary 'v2'")


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ({"requests": [_sample(1), _sample(2)]}, "2 series; the query must sum to one"),
        ({"requests": [_sample(math.nan)]}, "is not a count"),
        ({"requests": [{"metric": {}, "value": ["x"]}]}, "not an instant-vector sample"),
        ({"latency": [_sample(1, job="envoy")]}, "without 'le'"),
        ({"errors": [_sample(-1)]}, "is not a count"),
    ],
)
def test_answers_that_are_not_counts_are_source_errors(
    results: dict[str, list[dict[str, object]]], message: str
) -> None:
    full = {"requests": [_sample(5)], "errors": [], "latency": []} | results
    with pytest.raises(ScrapeError, match=message):
        version_counts(full, version="v1")


def test_settings_refuse_a_url_with_a_query_string() -> None:
    with pytest.raises(ValueError, match="url"):
        PrometheusAnalysis(url="http://p:9090/?x=1")
