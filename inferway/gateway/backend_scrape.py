"""The backends' own ``/metrics``, scraped by the gateway: what the rollout analysis
(``backend-*`` checks) and the autoscaler (queue length, utilization) read from the servers
themselves rather than from the proxy in front of them.

An inferway backend serves Prometheus text on its HTTP port (backends/telemetry/metrics.py):
``inferway_backend_requests_total{code}`` (every answer), the
``inferway_backend_request_duration_seconds`` histogram (time inside the server), and the
``queue_depth`` / ``inflight_batches`` gauges; every answer, ``/metrics`` included, carries its
ORCA load report (``endpoint-load-metrics``: the busy fraction of its instances), so one
request per replica brings all of it. Text is parsed by prometheus_client's parser.

Counters are running totals per process. A backend that restarted starts from zero: totals
that went down, or series created after the ones seen before (the ``_created`` timestamps),
mean a reset, and the new totals are then the whole window, never a negative count.

The parsing and differencing are pure (tested on text); :func:`scrape_backends` is the thin
HTTP shell.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from inferway.controllers.rollout.evidence import VersionCounts
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, ScrapeError, window_counts

__all__ = [
    "BackendScrape",
    "BackendTotals",
    "backend_window",
    "is_server_error",
    "parse_backend_metrics",
    "scrape_backends",
]

_REQUESTS = "inferway_backend_requests_total"
_DURATION = "inferway_backend_request_duration_seconds"
_QUEUE = "inferway_backend_queue_depth"
_QUEUE_WAIT = "inferway_backend_queue_wait_seconds"
_INFLIGHT = "inferway_backend_inflight_batches"
_ORCA_HEADER = "endpoint-load-metrics"
_ORCA_UTILIZATION = "application_utilization"
# gRPC codes that Envoy's gRPC-to-HTTP mapping (and so its 5xx class) counts as server errors
_GRPC_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def is_server_error(code: str) -> bool:
    """An HTTP 5xx or a gRPC code Envoy maps to one: the same class ``error-rate`` counts."""
    return (code.isdigit() and code.startswith("5")) or code in _GRPC_SERVER_ERRORS


@dataclass(frozen=True)
class BackendTotals:
    """One backend process at one scrape. ``answers``: running totals of its answers, server
    errors and request duration buckets (ms, cumulative, ``inf`` last), summed over models
    and protocols; ``started``: the earliest creation time of those series (None with no
    answer yet, or with ``--workers``, whose shared counters carry none); ``utilization``:
    its ORCA busy fraction, None when it sent no report."""

    answers: ClusterTotals = field(default_factory=ClusterTotals)
    queue_depth: float = 0.0
    inflight_batches: float = 0.0
    utilization: float | None = None
    started: float | None = None
    queue_wait_s: float = 0.0
    """Running total of the seconds requests waited in its batching queue (the queue-wait
    histogram's sum); ``queue_waited`` is how many left the queue (its count)."""
    queue_waited: float = 0.0

    def restarted_since(self, before: BackendTotals) -> bool:
        if self.answers.went_down_from(before.answers):
            return True
        return (
            before.started is not None
            and self.started is not None
            and self.started > before.started
        )


def _orca_utilization(header: str | None) -> float | None:
    """``application_utilization`` of a ``TEXT k=v, ...`` ORCA report (None if absent)."""
    if not header or not header.startswith("TEXT "):
        return None
    for part in header[len("TEXT ") :].split(","):
        key, _, value = part.strip().partition("=")
        if key == _ORCA_UTILIZATION:
            try:
                number = float(value)
            except ValueError:
                return None
            return min(max(number, 0.0), 1.0) if math.isfinite(number) else None
    return None


def parse_backend_metrics(text: str, orca: str | None = None) -> BackendTotals:
    """A backend's totals from its ``/metrics`` text and the ORCA header of that answer.
    Raises ScrapeError on text that is not Prometheus exposition."""
    requests = errors = 0
    buckets: dict[float, int] = {}
    queue = inflight = wait_s = waited = 0.0
    created: list[float] = []
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ScrapeError(f"not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if not math.isfinite(value):
                continue
            if name == _REQUESTS:
                requests += int(value)
                if is_server_error(labels.get("code", "")):
                    errors += int(value)
            elif name == f"{_DURATION}_bucket":
                le = labels.get("le", "")
                bound = math.inf if le == "+Inf" else float(le) * 1000.0
                buckets[bound] = buckets.get(bound, 0) + int(value)
            elif name in (f"{_DURATION}_created", "inferway_backend_requests_created"):
                created.append(value)
            elif name == _QUEUE:
                queue += value
            elif name == _INFLIGHT:
                inflight += value
            elif name == f"{_QUEUE_WAIT}_sum":
                wait_s += value
            elif name == f"{_QUEUE_WAIT}_count":
                waited += value
    return BackendTotals(
        answers=ClusterTotals(requests, min(errors, requests), buckets),
        queue_depth=queue,
        inflight_batches=inflight,
        utilization=_orca_utilization(orca),
        started=min(created) if created else None,
        queue_wait_s=wait_s,
        queue_waited=waited,
    )


def backend_window(
    before: Mapping[str, BackendTotals], now: Mapping[str, BackendTotals]
) -> VersionCounts:
    """What a version's backends answered between two scrapes, summed over its endpoints
    (by URL). An endpoint first seen now is only a baseline (its totals may predate the
    window); one that restarted counts from zero."""
    total = VersionCounts()
    for url, totals in now.items():
        previous = before.get(url)
        if previous is None:
            continue
        base = None if totals.restarted_since(previous) else previous.answers
        total.add(window_counts(base, totals.answers))
    return total


@dataclass(frozen=True)
class BackendScrape:
    """One pass over some backends: totals by URL, and why each one that failed did."""

    totals: dict[str, BackendTotals]
    failures: dict[str, str]

    def raise_for_failures(self, what: str) -> None:
        if self.failures:
            detail = "; ".join(f"{url}: {why}" for url, why in sorted(self.failures.items()))
            raise ScrapeError(f"{what} /metrics unreachable: {detail}")


async def _scrape_one(session: aiohttp.ClientSession, url: str) -> BackendTotals:
    target = url.rstrip("/") + "/metrics"
    try:
        async with session.get(target) as response:
            text = await response.text()
            if response.status != 200:
                raise ScrapeError(f"answered {response.status}")
            return parse_backend_metrics(text, response.headers.get(_ORCA_HEADER))
    except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError) as exc:
        raise ScrapeError(str(exc) or type(exc).__name__) from None


async def scrape_backends(session: aiohttp.ClientSession, urls: Iterable[str]) -> BackendScrape:
    """Every backend at ``urls`` (``http://host:port``) at once; a failure is recorded, not
    raised, so each caller decides what partial data is worth."""
    wanted = sorted(set(urls))
    results = await asyncio.gather(
        *(_scrape_one(session, url) for url in wanted), return_exceptions=True
    )
    totals: dict[str, BackendTotals] = {}
    failures: dict[str, str] = {}
    for url, result in zip(wanted, results, strict=True):
        if isinstance(result, ScrapeError):
            failures[url] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            totals[url] = result
    return BackendScrape(totals, failures)
