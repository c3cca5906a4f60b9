"""What the autoscaler is fed, as pure functions: Envoy's view of a service's cluster and its
replicas' own reports, turned into one MetricSample.

From Envoy's admin ``/stats/prometheus`` (parsed with prometheus_client's text parser):
``upstream_rq_total`` (a running total: its difference over the interval is the request rate),
``upstream_rq_active`` (requests in flight, queued ones included) and the ``upstream_rq_time``
histogram, whose buckets differenced over the interval give that interval's p99, and
``membership_healthy`` (the hosts Envoy holds healthy: the current count of a service whose
replicas something else runs). From each ready replica's ``/metrics``
(:mod:`inferway.gateway.backend_scrape`): ``inferway_backend_queue_depth`` summed over the
replicas is ``queue_length``, and the busy fraction of their instances (the ORCA report on the
answer) averaged over the replicas is ``utilization``; the difference of their queue-wait
histograms (``inferway_backend_queue_wait_seconds``) between two scrapes is ``queue_wait``, the
mean time the requests of the interval waited in those queues. A value the sources could not
give (no request in the interval, a replica that did not answer) is None, and a decision on it
holds the count: a queue summed over half the replicas would look like a reason to scale in.
From the gateway's own ``/metrics`` (the LLM accounting of OpenAI-compatible routes): the
difference of ``inferway_llm_tokens_total{backend=<service>}`` (input and output, every route,
model and client) over the interval is ``token_rate``, tokens per second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from inferway.controllers.autoscale.samples import MetricSample
from inferway.controllers.rollout.stats import weighted_quantile
from inferway.gateway.backend_scrape import BackendTotals
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, window_counts

__all__ = [
    "BACKEND_METRICS",
    "ClusterLoad",
    "StatsError",
    "build_sample",
    "interval_p99_s",
    "parse_cluster_load",
    "parse_token_total",
    "parse_token_totals",
    "replica_load",
    "replica_wait",
    "token_rate",
]

TOKENS = "inferway_llm_tokens_total"
"""The gateway's count of LLM tokens per route, model, backend (the service), client and type."""

BACKEND_METRICS = ("queue_length", "utilization", "queue_wait")
"""Metrics only the replicas' own /metrics give (they are scraped only for these)."""


class StatsError(Exception):
    """Envoy's stats could not be read; the message says why."""


@dataclass(frozen=True)
class ClusterLoad:
    """One cluster at one scrape: running request total, in flight, and the latency
    histogram's cumulative buckets (ms, ``inf`` last); ``healthy`` is its healthy hosts
    (None: Envoy does not list the cluster)."""

    requests_total: int
    active: int
    buckets: Mapping[float, int] = field(default_factory=dict)
    healthy: int | None = None


def parse_cluster_load(text: str, cluster: str) -> ClusterLoad:
    """``cluster``'s load from Envoy's Prometheus text; a cluster Envoy does not list yet
    (no snapshot, no request) reads as idle. Raises StatsError on text that is not
    Prometheus exposition."""
    total = active = 0
    healthy: int | None = None
    buckets: dict[float, int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise StatsError(f"Envoy's /stats/prometheus is not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            if sample.labels.get("envoy_cluster_name") != cluster:
                continue
            if sample.name == "envoy_cluster_upstream_rq_total":
                total = int(sample.value)
            elif sample.name == "envoy_cluster_upstream_rq_active":
                active = int(sample.value)
            elif sample.name == "envoy_cluster_membership_healthy":
                healthy = int(sample.value)
            elif sample.name == "envoy_cluster_upstream_rq_time_bucket":
                le = sample.labels.get("le", "")
                buckets[math.inf if le == "+Inf" else float(le)] = int(sample.value)
    return ClusterLoad(total, active, buckets, healthy)


def parse_token_totals(text: str) -> dict[str, float]:
    """Service (the ``backend`` label) -> the tokens the gateway counted for it so far; raises
    StatsError on text that is not Prometheus exposition."""
    totals: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise StatsError(f"the gateway's /metrics is not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            if sample.name == TOKENS and "backend" in sample.labels:
                backend = sample.labels["backend"]
                totals[backend] = totals.get(backend, 0.0) + sample.value
    return totals


def parse_token_total(text: str, service: str) -> float:
    """The tokens the gateway counted for ``service`` so far (0 before its first)."""
    return parse_token_totals(text).get(service, 0.0)


def token_rate(before: tuple[float, float] | None, now: tuple[float, float]) -> float | None:
    """Tokens per second between two (time, running total) readings; None for the first
    reading, no time between them, or a total that went down (the gateway restarted)."""
    if before is None:
        return None
    (then, previous), (at, total) = before, now
    if at <= then or total < previous:
        return None
    return (total - previous) / (at - then)


def interval_p99_s(before: ClusterLoad | None, now: ClusterLoad) -> float | None:
    """The p99 (seconds) of the requests timed between two scrapes, read as Prometheus'
    ``histogram_quantile`` does (the bucket's upper bound); None without any. Buckets that
    went down (Envoy restarted) count from zero."""
    if before is None:
        return None
    latency = window_counts(
        ClusterTotals(before.requests_total, 0, before.buckets),
        ClusterTotals(now.requests_total, 0, now.buckets),
    ).latency_ms
    p99 = weighted_quantile(latency, 0.99)
    return None if p99 is None else p99 / 1000.0


def replica_load(
    totals: Mapping[str, BackendTotals], failures: int
) -> tuple[float | None, float | None]:
    """(queue_length, utilization) over the ready replicas that answered; both None when any
    failed (or none is ready), utilization None when none reported one."""
    if failures or not totals:
        return None, None
    queue = sum(t.queue_depth for t in totals.values())
    busy = [t.utilization for t in totals.values() if t.utilization is not None]
    return queue, (sum(busy) / len(busy) if busy else None)


def replica_wait(
    before: Mapping[str, BackendTotals] | None,
    now: Mapping[str, BackendTotals],
    queue_length: float | None,
) -> float | None:
    """The mean seconds the requests that left the replicas' batching queues during the
    interval waited there: the difference of their queue-wait histograms' sums over that of
    their counts, summed over the replicas (one new or restarted since counts from zero).
    Without a request leaving, 0 while nothing is queued, else unknown (None: hold)."""
    if before is None or queue_length is None:
        return None
    seconds = waited = 0.0
    for url, totals in now.items():
        previous = before.get(url)
        if previous is None or totals.queue_waited < previous.queue_waited:
            previous = BackendTotals()
        seconds += max(totals.queue_wait_s - previous.queue_wait_s, 0.0)
        waited += totals.queue_waited - previous.queue_waited
    if waited > 0:
        return seconds / waited
    return 0.0 if queue_length <= 0 else None


def build_sample(
    now: float,
    load: ClusterLoad,
    before: tuple[float, ClusterLoad] | None,
    *,
    queue_length: float | None = None,
    utilization: float | None = None,
    queue_wait: float | None = None,
    last_p99: float | None = None,
    tokens_per_s: float | None = None,
) -> MetricSample:
    """The MetricSample at ``now`` from this scrape and the previous one (time, load).

    Envoy moves a histogram's buckets only at its stats flush (5 s by default), so an
    interval with requests but no flush keeps ``last_p99``, the latest p99 Envoy published;
    an interval without requests has none."""
    rate = None
    p99 = None
    if before is not None:
        then, previous = before
        if now > then and load.requests_total >= previous.requests_total:
            rate = (load.requests_total - previous.requests_total) / (now - then)
        p99 = interval_p99_s(previous, load)
        if p99 is None and rate:
            p99 = last_p99
    return MetricSample(
        time=now,
        queue_length=queue_length,
        in_flight=float(load.active),
        request_rate=rate,
        token_rate=tokens_per_s,
        p99_latency=p99,
        utilization=utilization,
        queue_wait=queue_wait,
    )
