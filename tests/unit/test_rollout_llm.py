"""Canary analysis of streamed LLM answers: the ``ttft`` and ``itl`` checks judge the time to
first token and per output token on their own (a canary whose whole answers take as long as
stable's but that starts streaming twice as late fails), their evidence survives a restart,
the policy takes them with ``source: prometheus`` only, and Prometheus' buckets in seconds
become ms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferway.controllers.rollout.analysis import analyze
from inferway.controllers.rollout.config import AnalysisConfig, LatencyCheck, MetricName
from inferway.controllers.rollout.evidence import Evidence, VersionCounts
from inferway.gateway.rollouts.config import build_rollout_config
from inferway.gateway.rollouts.prometheus_source import PrometheusSource, version_counts
from inferway.gateway.rollouts.sample_source import build_rollout_source
from inferway.policies import PolicyError, load_policy_text
from inferway.state import State
from tests.rollout_samples import TWO_VERSION_ROLLOUT


def _histogram(rng: np.random.Generator, n: int, median_ms: float) -> dict[float, int]:
    """``n`` log-normal times in log-spaced buckets 5% apart (value: the bucket's bound)."""
    ms = rng.lognormal(math.log(median_ms), 0.3, n)
    index = np.ceil(np.log(ms) / math.log(1.05))
    buckets, counts = np.unique(index, return_counts=True)
    return {round(1.05 ** float(b), 3): int(c) for b, c in zip(buckets, counts, strict=True)}


def _evidence(rng: np.random.Generator, *, canary_ttft: float, canary_itl: float) -> Evidence:
    n = 3000
    same = _histogram(rng, n, 900.0)  # whole answers: equal for both versions
    stable = VersionCounts(n, 0, same, _histogram(rng, n, 120.0), _histogram(rng, n, 20.0))
    canary = VersionCounts(
        n,
        0,
        dict(same),
        _histogram(rng, n, 120.0 * canary_ttft),
        _histogram(rng, n, 20.0 * canary_itl),
    )
    return Evidence(stable=stable, canary=canary, step_canary_requests=n)


def _verdicts(ev: Evidence) -> dict[str, str]:
    config = AnalysisConfig(
        checks=(
            LatencyCheck(0.2, MetricName.LATENCY_P99),
            LatencyCheck(0.2, MetricName.TTFT),
            LatencyCheck(0.2, MetricName.ITL),
        )
    )
    return {v.check: v.result for v in analyze(config, ev, {}).verdicts}


def test_a_canary_that_streams_its_first_token_twice_as_late_fails_on_ttft_alone() -> None:
    rng = np.random.default_rng(34)
    verdicts = _verdicts(_evidence(rng, canary_ttft=2.0, canary_itl=1.0))
    assert verdicts == {"latency-p99": "pass", "ttft": "fail", "itl": "pass"}


def test_a_canary_with_slower_tokens_fails_on_itl_and_an_equal_one_passes() -> None:
    rng = np.random.default_rng(35)
    assert _verdicts(_evidence(rng, canary_ttft=1.0, canary_itl=1.5))["itl"] == "fail"
    assert set(_verdicts(_evidence(rng, canary_ttft=1.0, canary_itl=1.0)).values()) == {"pass"}


def test_token_timings_survive_a_restart_and_old_saved_evidence_has_none() -> None:
    counts = VersionCounts(3, 1, {10.0: 3}, {100.0: 2, 200.0: 1}, {20.0: 30})
    ev = Evidence(stable=counts, canary=counts.plus(counts))
    again = Evidence.from_json(ev.to_json())
    assert again.canary.ttft_ms == {100.0: 4, 200.0: 2} and again.canary.itl_ms == {20.0: 60}
    old = {"requests": 1, "errors": 0, "latency_ms": [[5.0, 1]]}
    assert VersionCounts.from_json(old).ttft_ms == {}
    with pytest.raises(ValueError, match="ttft_ms counts must not be negative"):
        VersionCounts(1, 0, {}, {5.0: -1})


POLICY = (
    TWO_VERSION_ROLLOUT
    + """    steps: [1, 100]
    analysis:
      metrics:
        - {name: error-rate, max_increase: 0.5%}
        - {name: ttft, max_increase: 20%}
        - {name: itl, max_increase: 10%}
      source: prometheus
      prometheus: {url: "http://127.0.0.1:9090"}
"""
)


def test_the_policy_takes_ttft_and_itl_and_asks_prometheus_for_the_gateway_s_histograms() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    config = build_rollout_config(policy.rollouts[0])
    checks = {c.name: c for c in config.analysis.checks}
    ttft, itl = checks[MetricName.TTFT], checks[MetricName.ITL]
    assert isinstance(ttft, LatencyCheck) and ttft.max_increase == pytest.approx(0.2)
    assert isinstance(itl, LatencyCheck) and itl.distribution == "itl_ms"
    assert config.needs_llm_metrics
    source = build_rollout_source(config, policy, State(), lambda: None).stats
    assert isinstance(source, PrometheusSource)
    queries = source.queries("v2")
    bucket = 'gen_ai_server_time_to_first_token_seconds_bucket{backend="v2"}'
    assert queries["ttft"] == (  # a histogram that appeared inside the window counts whole
        f"sum by (le) ((increase({bucket}[30s]) and {bucket} offset 30s)"
        f" or ({bucket} unless {bucket} offset 30s))"
    )
    assert "gen_ai_server_time_per_output_token_seconds_bucket" in queries["itl"]
    assert set(_queries(POLICY.replace("ttft", "latency-p99"))) == {
        "requests",
        "errors",
        "latency",
        "ttft",
        "itl",
    }
    without = POLICY.replace("ttft", "latency-p99").replace(
        "- {name: itl, max_increase: 10%}", "- {name: latency-quantile, max_ms: 900}"
    )
    assert set(_queries(without)) == {"requests", "errors", "latency"}


def _queries(text: str) -> dict[str, str]:
    policy = load_policy_text(text, "p.yaml")
    config = build_rollout_config(policy.rollouts[0])
    stats = build_rollout_source(config, policy, State(), lambda: None).stats
    assert isinstance(stats, PrometheusSource)
    return stats.queries("v2")


def test_ttft_with_envoy_s_own_stats_is_refused_with_file_and_line() -> None:
    text = POLICY.split("      source:")[0]
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    assert "rollouts[0].analysis: metric ttft needs source: prometheus" in str(caught.value)


def _sample(value: float, **metric: str) -> dict[str, object]:
    return {"metric": metric, "value": [1700000000.0, str(value)]}


def test_token_histograms_in_seconds_become_ms_buckets() -> None:
    counts = version_counts(
        {
            "requests": [_sample(10)],
            "errors": [],
            "latency": [],
            "ttft": [_sample(6, le="0.05"), _sample(9, le="0.1"), _sample(10, le="+Inf")],
            "itl": [_sample(40, le="0.01"), _sample(50, le="+Inf")],
        },
        version="canary",
    )
    assert counts.ttft_ms == {50.0: 6, 100.0: 3, 200.0: 1}
    assert counts.itl_ms == {10.0: 40, 20.0: 10}
