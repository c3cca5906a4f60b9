"""The rollout's ``backend-*`` evidence: both versions' backends scraped together each
interval (:mod:`inferway.gateway.backend_scrape`), differenced per endpoint and summed per
version, so canary and stable are counted over the same window.

The endpoints are read from the live policy and State at every scrape (replicas come and go);
an endpoint seen for the first time is a baseline, one that restarted counts from zero.
Never promote blind: a version without endpoints, or any endpoint whose ``/metrics`` cannot
be read, is a ScrapeError (the rollout pauses with that reason), and the baseline is kept,
so the first window after the outage covers it.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from inferway.controllers.rollout.evidence import VersionCounts
from inferway.gateway.backend_scrape import BackendTotals, backend_window, scrape_backends
from inferway.gateway.rollouts.envoy_stats import ScrapeError

__all__ = ["BackendMetricsSource", "BackendURLs"]

BackendURLs = Callable[[str], list[str]]
"""Service name -> its endpoints' HTTP base URLs now."""


class BackendMetricsSource:
    """``sample()``: (stable, canary) counts since the previous call, None for the first."""

    def __init__(
        self, urls: BackendURLs, *, stable: str, canary: str, timeout_s: float = 5.0
    ) -> None:
        self._urls = urls
        self.stable, self.canary = stable, canary
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._last: dict[str, BackendTotals] | None = None

    async def sample(self) -> tuple[VersionCounts, VersionCounts] | None:
        """Raises ScrapeError (the pause reason)."""
        urls = {role: self._urls(service) for role, service in self._roles()}
        for role, service in self._roles():
            if not urls[role]:
                raise ScrapeError(f"{role} '{service}' has no endpoints to scrape /metrics from")
        async with aiohttp.ClientSession(timeout=self._timeout, trust_env=False) as session:
            scrape = await scrape_backends(session, urls["stable"] + urls["canary"])
        scrape.raise_for_failures("backend")
        before, self._last = self._last, scrape.totals
        if before is None:
            return None
        return (
            backend_window(before, _only(scrape.totals, urls["stable"])),
            backend_window(before, _only(scrape.totals, urls["canary"])),
        )

    def _roles(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return ("stable", self.stable), ("canary", self.canary)


def _only(totals: dict[str, BackendTotals], urls: list[str]) -> dict[str, BackendTotals]:
    return {url: totals[url] for url in urls if url in totals}
