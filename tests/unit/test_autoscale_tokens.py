"""Scaling an LLM service on tokens per second (``metric: token_rate``): the policy takes it,
the gateway's own token count (a real prometheus_client registry's exposition) becomes the
service's rate between two samples, and the autoscaler sizes the service by it as it does by
requests (an additive metric: tokens/s over the target per replica); ``scale status`` shows
each LLM service's tokens/s and per replica."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from rich.console import Console

from inferway.cli.scale import render_autoscale
from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.samples import MetricSample, needed_replicas
from inferway.gateway.autoscale_inputs import (
    ClusterLoad,
    StatsError,
    build_sample,
    parse_token_total,
    parse_token_totals,
    token_rate,
)
from inferway.gateway.autoscale_policy import autoscale_config

LABELS = ["route", "model", "backend", "client", "type", "estimated"]


def _gateway_metrics() -> tuple[Counter, CollectorRegistry]:
    registry = CollectorRegistry()
    tokens = Counter(
        "inferway_llm_tokens", "LLM tokens counted by the gateway.", LABELS, registry=registry
    )
    return tokens, registry


def test_the_service_s_tokens_are_summed_over_routes_models_clients_and_types() -> None:
    tokens, registry = _gateway_metrics()
    tokens.labels("chat", "small", "llama", "a", "input", "false").inc(1200)
    tokens.labels("chat", "small", "llama", "b", "output", "true").inc(300)
    tokens.labels("batch", "big", "llama", "a", "output", "false").inc(500)
    tokens.labels("chat", "small", "other", "a", "output", "false").inc(7)
    text = generate_latest(registry).decode()
    assert parse_token_total(text, "llama") == 2000
    assert parse_token_total(text, "other") == 7
    assert parse_token_total(text, "quiet") == 0
    with pytest.raises(StatsError, match="the gateway's /metrics is not Prometheus text"):
        parse_token_total("inferway_llm_tokens_total{backend=", "llama")


def test_the_rate_is_the_difference_over_the_interval_and_unknown_after_a_restart() -> None:
    assert token_rate(None, (10.0, 500.0)) is None  # the first reading
    assert token_rate((10.0, 500.0), (15.0, 3000.0)) == 500.0
    assert token_rate((10.0, 500.0), (10.0, 600.0)) is None  # no time between
    assert token_rate((10.0, 5000.0), (15.0, 10.0)) is None  # the gateway restarted
    sample = build_sample(15.0, ClusterLoad(20, 3), (10.0, ClusterLoad(10, 1)), tokens_per_s=500)
    assert (sample.token_rate, sample.request_rate) == (500, 2.0)
    assert sample.value("token_rate") == 500


def test_the_policy_scales_on_tokens_per_second_per_replica() -> None:
    config = autoscale_config(
        "chat",
        {
            "algorithm": "proportional",
            "metric": "token_rate",
            "target": 500,
            "min_replicas": 1,
            "max_replicas": 10,
        },
    )
    assert config.metric == "token_rate"
    # additive: 2,000 tokens/s at 500 per replica wants 4, whatever the ready count
    assert needed_replicas("token_rate", 2000, ready=1, target=500) == 4
    scaler = Autoscaler(config)
    for t in range(0, 60, 5):
        scaler.observe(MetricSample(time=float(t), token_rate=2000.0))
    assert scaler.decide(60.0, current=2, ready=2).desired == 4
    predictive = autoscale_config(
        "chat", {"algorithm": "predictive", "metric": "token_rate", "target": 500}
    )
    assert predictive.metric == "token_rate"


def test_an_unknown_token_metric_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="token_rate"):
        autoscale_config("chat", {"metric": "tokens_per_second", "target": 500})


def test_every_service_s_token_count_is_read_in_one_pass() -> None:
    tokens, registry = _gateway_metrics()
    tokens.labels("chat", "small", "llama", "a", "output", "false").inc(40)
    tokens.labels("chat", "small", "mistral", "a", "input", "false").inc(2)
    assert parse_token_totals(generate_latest(registry).decode()) == {"llama": 40, "mistral": 2}


def test_scale_status_shows_an_llm_service_s_tokens_per_second_and_per_replica() -> None:
    document: dict[str, Any] = {
        "services": [
            {
                "service": "chat",
                "algorithm": "proportional",
                "metric": "token_rate",
                "sampling_interval_s": 5.0,
                "scale_target": {"kind": "metric"},
                "last_decision": None,
                "error": None,
                "tokens_per_s": 2400.0,
                "tokens_per_s_per_replica": 800.0,
            },
            {
                "service": "vision",
                "algorithm": "proportional",
                "metric": "in_flight",
                "sampling_interval_s": 5.0,
                "scale_target": {"kind": "metric"},
                "last_decision": None,
                "error": None,
                "tokens_per_s": None,
                "tokens_per_s_per_replica": None,
            },
        ],
        "decisions": [],
    }
    console = Console(record=True, width=160)
    render_autoscale(document, console)  # type: ignore[arg-type]
    text = console.export_text()
    assert "chat  proportional on token_rate  2,400 tokens/s (800 per replica)" in text, text
    assert "vision  proportional on in_flight  -> published metric" in text, text
