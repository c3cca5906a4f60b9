"""The backends' /metrics as evidence, pure parts: the exposition a real BackendMetrics
registry writes -> totals (server errors, duration buckets in ms, gauges, the ORCA busy
fraction), windows summed over a version's endpoints with restarts counted from zero, and the
``backend-*`` checks judging those counts, not the proxy's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from inferway.backends.telemetry.metrics import BackendMetrics
from inferway.controllers.rollout.analysis import analyze
from inferway.controllers.rollout.config import AnalysisConfig, LatencyCheck
from inferway.controllers.rollout.evidence import Evidence, VersionCounts, WindowSample
from inferway.gateway.backend_scrape import (
    BackendScrape,
    BackendTotals,
    backend_window,
    is_server_error,
    parse_backend_metrics,
)
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, ScrapeError
from inferway.gateway.rollouts.sample_source import RolloutSource

ORCA = "TEXT rps_fractional=12.5, application_utilization=0.75, named_metrics.queue_depth=3"


def _exposition(
    answers: Sequence[tuple[str | int, float]],
    queue_depth: int = 0,
    queue_waits: Sequence[float] = (),
) -> str:
    model = SimpleNamespace(
        name="mlp",
        version="1",
        load_seconds=0.1,
        executor=SimpleNamespace(queue_depth=queue_depth, in_flight_batches=1),
    )
    metrics = BackendMetrics(lambda: [model], ready=lambda: True)
    for waited in queue_waits:
        metrics.queue_wait.labels("mlp", "1").observe(waited)
    for code, seconds in answers:
        protocol = "grpc" if isinstance(code, str) else "http"
        metrics.observe_request(
            model="mlp", version="1", protocol=protocol, code=code, seconds=seconds
        )
    return generate_latest(metrics.registry).decode()


def test_a_backends_exposition_becomes_answers_errors_buckets_and_load() -> None:
    answers: list[tuple[str | int, float]] = [(200, 0.003)] * 6 + [
        (503, 0.3),
        ("INTERNAL", 0.002),
        (400, 0.001),
        ("RESOURCE_EXHAUSTED", 0.001),
    ]
    totals = parse_backend_metrics(
        _exposition(answers, queue_depth=4, queue_waits=(0.25, 0.5)), ORCA
    )
    assert totals.answers.requests == 10
    assert totals.answers.errors == 2, "503 and INTERNAL; 400 and RESOURCE_EXHAUSTED are not 5xx"
    buckets = totals.answers.buckets
    assert buckets[5.0] == 9 and buckets[250.0] == 9 and buckets[500.0] == 10  # ms
    assert buckets[math.inf] == 10
    assert totals.queue_depth == 4 and totals.inflight_batches == 1
    assert (totals.queue_wait_s, totals.queue_waited) == (0.75, 2)  # the histogram's sum, count
    assert totals.utilization == 0.75
    assert totals.started is not None
    assert parse_backend_metrics(_exposition([]), None) == BackendTotals(
        queue_depth=0, inflight_batches=1, utilization=None, started=None
    )


def test_server_errors_are_the_class_envoy_counts_as_5xx() -> None:
    assert [is_server_error(c) for c in ("500", "504", "UNAVAILABLE", "DEADLINE_EXCEEDED")] == [
        True
    ] * 4
    assert not any(is_server_error(c) for c in ("200", "404", "429", "OK", "NOT_FOUND", ""))


def test_text_that_is_not_an_exposition_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError, match="not Prometheus text"):
        parse_backend_metrics('inferway_backend_requests_total{code="200" 3\n')


def _totals(
    requests: int, errors: int, buckets: dict[float, int], started: float = 1.0
) -> BackendTotals:
    return BackendTotals(ClusterTotals(requests, errors, buckets), started=started)


def test_a_versions_window_sums_its_endpoints_and_a_new_one_is_only_a_baseline() -> None:
    before = {
        "http://a": _totals(10, 1, {5.0: 8, math.inf: 10}),
        "http://b": _totals(4, 0, {5.0: 4, math.inf: 4}),
    }
    now = {
        "http://a": _totals(30, 2, {5.0: 25, math.inf: 30}),
        "http://b": _totals(10, 1, {5.0: 9, math.inf: 10}),
        "http://c": _totals(500, 50, {5.0: 500, math.inf: 500}),  # joined: totals predate us
    }
    window = backend_window(before, now)
    # +Inf is placed at twice the highest bound, as for Envoy's histograms
    assert window == VersionCounts(26, 2, {5.0: 22, 10.0: 4})
    assert backend_window(before, {"http://a": before["http://a"]}) == VersionCounts()


def test_a_restarted_backend_counts_from_zero_by_its_totals_or_its_series_age() -> None:
    before = {"http://a": _totals(1000, 10, {5.0: 1000, math.inf: 1000}, started=100.0)}
    dropped = {"http://a": _totals(7, 1, {5.0: 7, math.inf: 7}, started=200.0)}
    assert backend_window(before, dropped) == VersionCounts(7, 1, {5.0: 7})
    # restarted and already past the old totals: only the series' creation time tells
    passed = {"http://a": _totals(1200, 10, {5.0: 1200, math.inf: 1200}, started=200.0)}
    assert backend_window(before, passed) == VersionCounts(1200, 10, {5.0: 1200})
    same = {"http://a": _totals(1200, 10, {5.0: 1200, math.inf: 1200}, started=100.0)}
    assert backend_window(before, same) == VersionCounts(200, 0, {5.0: 200})


def test_failed_endpoints_are_one_error_naming_each() -> None:
    scrape = BackendScrape({}, {"http://b:2": "answered 500", "http://a:1": "refused"})
    with pytest.raises(ScrapeError, match=r"backend /metrics unreachable: http://a:1: refused; "):
        scrape.raise_for_failures("backend")
    BackendScrape({"http://a:1": BackendTotals()}, {}).raise_for_failures("backend")


def _sample(proxy: tuple[int, int], backend: tuple[int, int], n: int = 200) -> WindowSample:
    """Latency (ms) per version: proxy stable/canary, backend stable/canary, n samples each."""

    def counts(ms: int) -> VersionCounts:
        return VersionCounts(n, 0, {float(ms): n})

    return WindowSample(
        counts(proxy[0]), counts(proxy[1]), backend_stable=counts(backend[0]),
        backend_canary=counts(backend[1]),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "expected"), [("backend-latency-p99", "fail"), ("latency-p99", "pass")]
)
def test_the_backend_latency_check_judges_the_backends_counts(name: str, expected: str) -> None:
    evidence = Evidence()
    # the proxy sees both near 50 ms (network-bound), the canary's server takes 4x longer
    evidence.add(_sample(proxy=(50, 49), backend=(5, 20)))
    check = LatencyCheck(0.2, name)  # type: ignore[arg-type]
    analysis = analyze(AnalysisConfig(checks=(check,)), evidence, {})
    (verdict,) = analysis.verdicts
    assert verdict.check == name and verdict.result == expected, verdict.reason
    assert verdict.inputs["canary_samples"] == 200


def test_saved_evidence_without_backend_counts_reads_back_empty() -> None:
    evidence = Evidence()
    evidence.add(_sample(proxy=(1, 2), backend=(3, 4), n=5))
    data = evidence.to_json()
    assert Evidence.from_json(data) == evidence
    del data["backend_stable"], data["backend_canary"]
    old = Evidence.from_json(data)
    assert old.backend_canary == VersionCounts() and old.canary == evidence.canary


class _Queue:
    """Stands in for a source: returns (or raises) the given results in turn."""

    def __init__(self, *results: object) -> None:
        self.results = list(results)

    async def sample(self) -> object:
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


async def test_a_window_read_before_a_backend_scrape_failed_is_held_for_the_next() -> None:
    one = WindowSample(VersionCounts(10, 1), VersionCounts(5, 0))
    two = WindowSample(VersionCounts(20, 0), VersionCounts(7, 1))
    backend = (VersionCounts(3, 0, {5.0: 3}), VersionCounts(4, 1, {9.0: 4}))
    source = RolloutSource(
        _Queue(None, one, two),  # type: ignore[arg-type]
        backend=_Queue(None, ScrapeError("canary down"), backend),  # type: ignore[arg-type]
    )
    assert await source.sample() is None  # both baselines
    with pytest.raises(ScrapeError, match="canary down"):
        await source.sample()
    joined = await source.sample()
    assert joined is not None
    assert joined.stable == VersionCounts(30, 1) and joined.canary == VersionCounts(12, 1)
    assert (joined.backend_stable, joined.backend_canary) == backend
