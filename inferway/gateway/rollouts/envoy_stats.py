"""Envoy's own per-cluster stats as the rollout analysis' window samples (``source: envoy``).

Envoy's admin ``/stats/prometheus`` has running totals per cluster: requests completed, by
response class, and the ``upstream_rq_time`` histogram (cumulative buckets, in ms). A window
is the difference between two scrapes. Envoy restarting (hot restart, crash, the supervisor)
resets its totals; a total that went down means a reset, and the new total is then the
window (as Prometheus' ``rate`` reads it), never a negative count.

The parsing and differencing are pure (tested on text); :class:`EnvoyStatsSource` is the thin
HTTP shell that scrapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp

from inferway.controllers.rollout.evidence import VersionCounts, WindowSample

__all__ = [
    "ClusterTotals",
    "EnvoyStatsSource",
    "ScrapeError",
    "build_window",
    "parse_cluster_totals",
    "window_counts",
]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_FILTER = r"cluster\.[^.]+\.upstream_rq_(time|completed|xx|[1-5]xx)"


class ScrapeError(Exception):
    """The metric source could not be read; the message says why (shown as the pause reason)."""


@dataclass(frozen=True)
class ClusterTotals:
    """One cluster's running totals at one scrape. ``buckets``: upper bound (ms, ``inf``
    for the last) -> cumulative count. ``active`` (requests in flight) and ``healthy`` (hosts
    Envoy holds healthy; None: not reported) are gauges the fleet's autoscaler sums and reads
    from each Envoy's pushed stats; the rollout analysis ignores them."""

    requests: int = 0
    errors: int = 0
    buckets: Mapping[float, int] = field(default_factory=dict)
    active: int = 0
    healthy: int | None = None

    def went_down_from(self, before: ClusterTotals) -> bool:
        if self.requests < before.requests or self.errors < before.errors:
            return True
        return any(self.buckets.get(le, 0) < n for le, n in before.buckets.items())


def parse_cluster_totals(text: str, clusters: Iterable[str]) -> dict[str, ClusterTotals]:
    """Totals of each of ``clusters`` from Envoy's Prometheus text (a cluster Envoy does not
    report, e.g. not yet received, has zero totals). Raises ScrapeError on text that is not
    Prometheus exposition."""
    wanted = set(clusters)
    completed: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    buckets: dict[str, dict[float, int]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ScrapeError(f"not Prometheus text: {line[:80]!r}")
        name, labels_text, value_text = match.groups()
        if not name.startswith("envoy_cluster_upstream_rq_"):
            continue
        labels = dict(_LABEL.findall(labels_text or ""))
        cluster = labels.get("envoy_cluster_name")
        if cluster not in wanted:
            continue
        try:
            value = float(value_text)
        except ValueError:
            raise ScrapeError(f"not a number in {line[:80]!r}") from None
        if name == "envoy_cluster_upstream_rq_completed":
            completed[cluster] = int(value)
        elif name == "envoy_cluster_upstream_rq_xx":
            code_class = labels.get("envoy_response_code_class", "")
            classes.setdefault(cluster, {})[code_class] = int(value)
        elif name == "envoy_cluster_upstream_rq_time_bucket":
            le = labels.get("le", "")
            bound = math.inf if le == "+Inf" else float(le)
            buckets.setdefault(cluster, {})[bound] = int(value)
    totals: dict[str, ClusterTotals] = {}
    for cluster in wanted:
        by_class = classes.get(cluster, {})
        requests = completed.get(cluster, sum(by_class.values()))
        errors = min(by_class.get("5", 0), requests)
        totals[cluster] = ClusterTotals(requests, errors, dict(buckets.get(cluster, {})))
    return totals


def window_counts(before: ClusterTotals | None, now: ClusterTotals) -> VersionCounts:
    """What happened between two scrapes of one set of totals; totals that went down
    (a restart) count from zero, never negative."""
    base = ClusterTotals() if before is None or now.went_down_from(before) else before
    requests = now.requests - base.requests
    errors = min(now.errors - base.errors, requests)
    finite = sorted(le for le in now.buckets if math.isfinite(le))
    overflow = 2 * finite[-1] if finite else 1.0  # the +Inf bucket: above every bound
    latency: dict[float, int] = {}
    below = 0
    for le in sorted(now.buckets):
        cumulative = now.buckets[le] - base.buckets.get(le, 0)
        count = cumulative - below
        below = max(below, cumulative)
        if count > 0:
            latency[le if math.isfinite(le) else overflow] = count
    return VersionCounts(requests=requests, errors=errors, latency_ms=latency)


def build_window(
    before: Mapping[str, ClusterTotals] | None,
    now: Mapping[str, ClusterTotals],
    *,
    stable: str,
    canary: str,
) -> WindowSample:
    """What happened between two scrapes, per version; a cluster whose totals went down
    (Envoy restarted) counts from zero."""
    prev = before or {}
    return WindowSample(
        stable=window_counts(prev.get(stable), now.get(stable, ClusterTotals())),
        canary=window_counts(prev.get(canary), now.get(canary, ClusterTotals())),
    )


class EnvoyStatsSource:
    """Scrapes one Envoy's admin ``/stats/prometheus`` for a rollout's two clusters and
    returns the window since the previous scrape (None for the first: it is the baseline)."""

    def __init__(
        self,
        admin_port: Callable[[], int | None],
        *,
        stable: str,
        canary: str,
        host: str = "127.0.0.1",
        timeout_s: float = 5.0,
    ) -> None:
        self._admin_port = admin_port
        self._host = host
        self.stable, self.canary = stable, canary
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._last: dict[str, ClusterTotals] | None = None

    async def scrape(self) -> dict[str, ClusterTotals]:
        port = self._admin_port()
        if port is None:
            raise ScrapeError("no Envoy admin port is known (Envoy not started?)")
        url = f"http://{self._host}:{port}/stats/prometheus"
        params = {"usedonly": "", "filter": _FILTER}
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout, trust_env=False) as session,
                session.get(url, params=params) as response,
            ):
                text = await response.text()
                if response.status != 200:
                    raise ScrapeError(f"Envoy admin {url} answered {response.status}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ScrapeError(f"Envoy admin {url}: {exc or type(exc).__name__}") from None
        return parse_cluster_totals(text, (self.stable, self.canary))

    async def sample(self) -> WindowSample | None:
        """Raises ScrapeError; the baseline is kept, so the first window after an outage
        covers it (every request Envoy counted meanwhile is judged, none is lost)."""
        now = await self.scrape()
        before, self._last = self._last, now
        if before is None:
            return None
        return build_window(before, now, stable=self.stable, canary=self.canary)
