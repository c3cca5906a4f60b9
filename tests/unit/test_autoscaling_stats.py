"""The autoscaling driver's pure parts: a cluster's load from Envoy's /stats?format=json, and
``inferway scale status``'s text rendering of GET /autoscale."""

from __future__ import annotations

import pytest
from rich.console import Console

from inferway.gateway.autoscaling import ClusterLoad, StatsError, parse_cluster_load
from inferway.gateway.scale_cli import render_autoscale

STATS = {
    "stats": [
        {"name": "cluster.model.upstream_rq_total", "value": 41},
        {"name": "cluster.model.upstream_rq_active", "value": 3},
        {"name": "cluster.model_v2.upstream_rq_total", "value": 7},
        {"name": "cluster.other.upstream_rq_active", "value": 9},
    ]
}


def test_only_the_named_cluster_is_read() -> None:
    assert parse_cluster_load(STATS, "model") == ClusterLoad(41, 3)
    assert parse_cluster_load(STATS, "model_v2") == ClusterLoad(7, 0)


def test_a_cluster_envoy_does_not_list_yet_reads_as_idle() -> None:
    assert parse_cluster_load({"stats": []}, "model") == ClusterLoad(0, 0)


def test_a_document_without_stats_is_an_error_not_zero_load() -> None:
    with pytest.raises(StatsError, match="no 'stats' list"):
        parse_cluster_load({"histograms": []}, "model")


def test_scale_status_text_shows_the_rule_the_replicas_and_the_decisions() -> None:
    decision = {
        "service": "model",
        "current": 1,
        "ready": 1,
        "desired": 3,
        "direction": "up",
        "inputs": {"in_flight": 6.0, "request_rate": None},
        "reason": "in_flight 6 / target 2 per replica = 3.00 -> 3; scale out 1->3",
    }
    document = {
        "services": [
            {
                "service": "model",
                "algorithm": "proportional",
                "metric": "in_flight",
                "last_decision": decision,
                "error": "Envoy admin: refused",
            }
        ],
        "decisions": [decision],
        "replicas": {
            "services": [{"service": "model", "desired": 3, "ready": 1, "min": 1, "max": 3}]
        },
    }
    console = Console(record=True, width=120)
    render_autoscale(document, console)
    text = console.export_text()
    assert "model  proportional on in_flight  1 ready of 3 desired (min 1, max 3)" in text
    assert "scale out 1->3" in text and "metrics: Envoy admin: refused" in text
    assert "in_flight 6" in text and "request_rate" not in text.split("recent decisions")[1]
