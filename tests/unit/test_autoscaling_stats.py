"""The autoscaling driver's pure parts: a cluster's load from Envoy's /stats/prometheus (rate,
in flight, the interval's p99), the replicas' queue and busy fraction, and ``inferway scale
status``'s text rendering of GET /autoscale."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from inferway.cli.scale import render_autoscale
from inferway.gateway.autoscale_inputs import (
    ClusterLoad,
    StatsError,
    build_sample,
    interval_p99_s,
    parse_cluster_load,
    replica_load,
    replica_wait,
)
from inferway.gateway.backend_scrape import BackendTotals


def _envoy(total: int, active: int, buckets: dict[str, int], cluster: str = "model") -> str:
    lines = [
        "# TYPE envoy_cluster_upstream_rq_total counter",
        f'envoy_cluster_upstream_rq_total{{envoy_cluster_name="{cluster}"}} {total}',
        "# TYPE envoy_cluster_upstream_rq_active gauge",
        f'envoy_cluster_upstream_rq_active{{envoy_cluster_name="{cluster}"}} {active}',
        "# TYPE envoy_cluster_upstream_rq_time histogram",
    ]
    lines += [
        f'envoy_cluster_upstream_rq_time_bucket{{envoy_cluster_name="{cluster}",le="{le}"}} {n}'
        for le, n in buckets.items()
    ]
    lines += [
        f'envoy_cluster_upstream_rq_time_sum{{envoy_cluster_name="{cluster}"}} 1',
        f'envoy_cluster_upstream_rq_time_count{{envoy_cluster_name="{cluster}"}} {total}',
    ]
    return "\n".join(lines) + "\n"


STATS = _envoy(41, 3, {"5": 30, "50": 40, "+Inf": 41}).replace(
    "# TYPE envoy_cluster_upstream_rq_active gauge\n",
    "# TYPE envoy_cluster_upstream_rq_active gauge\n"
    'envoy_cluster_upstream_rq_active{envoy_cluster_name="other"} 9\n',
)


def test_only_the_named_cluster_is_read() -> None:
    load = parse_cluster_load(STATS, "model")
    assert load == ClusterLoad(41, 3, {5.0: 30, 50.0: 40, math.inf: 41})
    assert parse_cluster_load(STATS, "other") == ClusterLoad(0, 9)


def test_a_cluster_envoy_does_not_list_yet_reads_as_idle() -> None:
    assert parse_cluster_load("", "model") == ClusterLoad(0, 0)


def test_text_that_is_not_prometheus_is_an_error_not_zero_load() -> None:
    with pytest.raises(StatsError, match="not Prometheus text"):
        parse_cluster_load('envoy_cluster_upstream_rq_total{envoy_cluster_name="m" 3\n', "m")


def test_the_interval_p99_is_read_from_the_buckets_difference() -> None:
    before = parse_cluster_load(_envoy(100, 0, {"5": 100, "50": 100, "+Inf": 100}), "model")
    # 100 more: 90 under 5 ms, 10 between 5 and 50 ms: p99 is the 50 ms bucket
    now = parse_cluster_load(_envoy(200, 2, {"5": 190, "50": 200, "+Inf": 200}), "model")
    assert interval_p99_s(before, now) == pytest.approx(0.05)
    assert interval_p99_s(now, now) is None, "no request timed in the interval"
    assert interval_p99_s(None, now) is None
    restarted = parse_cluster_load(_envoy(10, 0, {"5": 10, "50": 10, "+Inf": 10}), "model")
    assert interval_p99_s(now, restarted) == pytest.approx(0.005)


def test_a_sample_has_the_rate_the_p99_in_flight_and_the_replicas_numbers() -> None:
    before = parse_cluster_load(_envoy(100, 0, {"5": 100, "+Inf": 100}), "model")
    now = parse_cluster_load(_envoy(150, 4, {"5": 150, "+Inf": 150}), "model")
    sample = build_sample(12.0, now, (10.0, before), queue_length=6.0, utilization=0.5)
    assert sample.request_rate == pytest.approx(25.0) and sample.in_flight == 4.0
    assert sample.p99_latency == pytest.approx(0.005)
    assert (sample.queue_length, sample.utilization) == (6.0, 0.5)
    # requests but no stats flush since: the p99 Envoy last published; no requests: none
    unflushed = parse_cluster_load(_envoy(160, 1, {"5": 150, "+Inf": 150}), "model")
    assert build_sample(13.0, unflushed, (12.0, now), last_p99=0.2).p99_latency == 0.2
    assert build_sample(13.0, now, (12.0, now), last_p99=0.2).p99_latency is None
    first = build_sample(10.0, before, None)
    assert first.request_rate is None and first.p99_latency is None and first.queue_length is None


def test_the_replicas_queue_adds_up_and_their_busy_fraction_is_averaged() -> None:
    totals = {
        "http://a": BackendTotals(queue_depth=5, utilization=0.9),
        "http://b": BackendTotals(queue_depth=2, utilization=0.5),
        "http://c": BackendTotals(queue_depth=1, utilization=None),  # sent no ORCA report
    }
    assert replica_load(totals, 0) == (8, pytest.approx(0.7))
    assert replica_load(totals, 1) == (None, None), "a replica missing: unknown, not less"
    assert replica_load({}, 0) == (None, None)
    assert replica_load({"http://c": totals["http://c"]}, 0) == (1, None)


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
    assert "scale out 1->3" in text and "error: Envoy admin: refused" in text
    assert "in_flight 6" in text and "request_rate" not in text.split("recent decisions")[1]


def test_the_queue_wait_is_what_the_intervals_requests_waited_in_the_replicas_queues() -> None:
    """Issue 33 item 11: the replicas' queue-wait histograms differenced over the interval,
    summed over them: seconds waited / requests that left the queue."""
    before = {
        "http://a": BackendTotals(queue_wait_s=10.0, queue_waited=100),
        "http://b": BackendTotals(queue_wait_s=4.0, queue_waited=40),
    }
    now = {
        "http://a": BackendTotals(queue_wait_s=13.0, queue_waited=120),  # 3 s over 20
        "http://b": BackendTotals(queue_wait_s=1.0, queue_waited=10),  # restarted: from 0
        "http://c": BackendTotals(queue_wait_s=0.5, queue_waited=10),  # new
    }
    assert replica_wait(before, now, 5.0) == pytest.approx((3.0 + 1.0 + 0.5) / 40)
    assert replica_wait(now, now, 0.0) == 0.0, "nobody waited and nobody is queued: idle"
    assert replica_wait(now, now, 2.0) is None, "queued but nobody left the queue: unknown"
    assert replica_wait(None, now, 5.0) is None and replica_wait(before, now, None) is None
    assert build_sample(1.0, ClusterLoad(0, 0), None, queue_wait=0.2).queue_wait == 0.2
