"""A rollout's windows from a real Prometheus (``analysis.source: prometheus``).

Each interval runs the policy's PromQL (``requests``, ``errors``, ``latency``, and for a
rollout with ``ttft``/``itl`` metrics those two over the gateway's ``gen_ai_server_*``
histograms) once per version through Prometheus' HTTP API (``/api/v1/query``) and builds the
same WindowSample the Envoy source builds. The counts are ``increase()`` over the window, i.e.
Prometheus' extrapolated estimates: they are rounded to whole requests, and a reset counter (Envoy
restarted) is handled by Prometheus itself. Every call is a full window, so unlike the Envoy
source there is no baseline scrape.

Never promote blind: an unreachable Prometheus, a query it refuses, a non-vector answer or
an empty ``requests`` result (the version's series is not scraped: wrong cluster name, or
Prometheus does not scrape this Envoy) is a ScrapeError, which pauses the rollout with that
reason. ``errors`` and ``latency`` may be empty: Envoy creates a response-class counter with
its first such response and a histogram with its first sample, so empty means none.

The result -> counts conversion is pure (:func:`version_counts`); the class is the thin
HTTP shell.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.gateway.rollouts.envoy_stats import ScrapeError
from inferway.policies.rollout_prometheus import (
    SECONDS_QUERIES,
    PrometheusAnalysis,
    render_query,
)

__all__ = ["LLM_QUERY_NAMES", "QUERY_NAMES", "PrometheusSource", "version_counts"]

QUERY_NAMES = ("requests", "errors", "latency")
LLM_QUERY_NAMES = ("ttft", "itl")

Result = Sequence[Mapping[str, Any]]
"""Prometheus' ``data.result`` of an instant vector: ``[{"metric": {...}, "value": [t, "v"]}]``."""


def _value(item: Mapping[str, Any], what: str) -> float:
    try:
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ScrapeError(f"{what}: not an instant-vector sample: {item!r:.120}") from None
    if math.isnan(value) or value < 0:
        raise ScrapeError(f"{what}: value {value} is not a count")
    return value


def _scalar(result: Result, what: str) -> float | None:
    if not result:
        return None
    if len(result) > 1:
        raise ScrapeError(f"{what}: {len(result)} series; the query must sum to one (sum(...))")
    return _value(result[0], what)


def _latency(result: Result, what: str, *, scale: float = 1.0) -> dict[float, int]:
    """Cumulative buckets (``le`` -> count) -> bucket upper bound -> count in that bucket,
    with the ``+Inf`` bucket at twice the highest finite bound (as the Envoy source does);
    bounds multiplied by ``scale`` (1000 for buckets in seconds)."""
    cumulative: dict[float, float] = {}
    for item in result:
        le = item.get("metric", {}).get("le")
        if le is None:
            raise ScrapeError(f"{what}: a series without 'le'; use sum by (le) (...)")
        try:
            bound = math.inf if le == "+Inf" else float(le) * scale
        except ValueError:
            raise ScrapeError(f"{what}: le={le!r} is not a bucket bound") from None
        cumulative[bound] = cumulative.get(bound, 0.0) + _value(item, what)
    finite = sorted(b for b in cumulative if math.isfinite(b))
    overflow = 2 * finite[-1] if finite else 1.0
    latency: dict[float, int] = {}
    below = 0
    for bound in sorted(cumulative):
        total = max(below, round(cumulative[bound]))  # extrapolation may wobble: stay monotone
        if total > below:
            latency[bound if math.isfinite(bound) else overflow] = total - below
        below = total
    return latency


def version_counts(results: Mapping[str, Result], *, version: str) -> VersionCounts:
    """One version's window from its query results (``ttft``/``itl`` where asked, in
    seconds, kept in ms). Raises ScrapeError for an empty ``requests`` result or an answer
    that is not counts."""
    requests = _scalar(results["requests"], f"{version} requests")
    if requests is None:
        raise ScrapeError(
            f"Prometheus has no requests series for {version} (is it scraping this Envoy, "
            "and is the cluster name right?)"
        )
    n = round(requests)
    errors = _scalar(results["errors"], f"{version} errors") or 0.0
    return VersionCounts(
        requests=n,
        errors=min(round(errors), n),
        latency_ms=_latency(results["latency"], f"{version} latency"),
        **{
            f"{name}_ms": _latency(
                results[name],
                f"{version} {name}",
                scale=1000.0 if name in SECONDS_QUERIES else 1.0,
            )
            for name in LLM_QUERY_NAMES
            if name in results
        },
    )


class PrometheusSource:
    """Queries one Prometheus for a rollout's two clusters each interval."""

    def __init__(
        self,
        settings: PrometheusAnalysis,
        *,
        stable: str,
        canary: str,
        interval_s: float,
        llm: bool = False,
    ) -> None:
        self.settings = settings
        self.names = QUERY_NAMES + (LLM_QUERY_NAMES if llm else ())
        self.stable, self.canary = stable, canary
        self.interval_s = interval_s
        self._url = settings.url.rstrip("/") + "/api/v1/query"
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout)

    def queries(self, cluster: str) -> dict[str, str]:
        """The PromQL for ``cluster``, by query name."""
        templates = self.settings.queries
        return {
            name: render_query(
                getattr(templates, name), cluster=cluster, interval_s=self.interval_s
            )
            for name in self.names
        }

    async def _query(self, session: aiohttp.ClientSession, promql: str) -> Result:
        try:
            async with session.get(self._url, params={"query": promql}) as response:
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = None
                if not isinstance(body, dict):
                    raise ScrapeError(
                        f"Prometheus {self._url} answered {response.status}, not JSON"
                    )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ScrapeError(f"Prometheus {self._url}: {exc or type(exc).__name__}") from None
        if body.get("status") != "success":
            raise ScrapeError(
                f"Prometheus refused {promql!r}: {body.get('errorType', response.status)}: "
                f"{body.get('error', '')}"
            )
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise ScrapeError(f"{promql!r} gave a {data.get('resultType')}, not an instant vector")
        result = data.get("result")
        return result if isinstance(result, list) else []

    async def _results(self, session: aiohttp.ClientSession, cluster: str) -> dict[str, Result]:
        queries = self.queries(cluster)
        answers = await asyncio.gather(*(self._query(session, q) for q in queries.values()))
        return dict(zip(queries, answers, strict=True))

    async def sample(self) -> WindowSample:
        """The last interval, per version. Raises ScrapeError (the pause reason)."""
        async with aiohttp.ClientSession(timeout=self._timeout, trust_env=False) as session:
            stable = await self._results(session, self.stable)
            canary = await self._results(session, self.canary)
        return WindowSample(
            stable=version_counts(stable, version=f"stable {self.stable!r}"),
            canary=version_counts(canary, version=f"canary {self.canary!r}"),
        )
