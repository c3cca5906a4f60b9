"""A rollout's metric source, picked by ``analysis.source``: Envoy's per-cluster window
(``envoy``) or PromQL against Prometheus (``prometheus``), plus, for an ``output-agreement``
check, the mirrored answers compared by the replicas' recorded digests
(:mod:`inferway.gateway.agreement_source`), and, for ``backend-*`` checks, the backends' own
``/metrics`` (:mod:`inferway.gateway.rollouts.backend_source`), all in the same WindowSample.

Agreement counts that arrive while there is no Envoy window yet (the first scrape is only a
baseline) are kept for the next window, never dropped. A replica whose records or metrics
cannot be read is a source error: the rollout pauses with that reason rather than judge half
the evidence, and the window already read is held and joined to the next one, so no request
goes unjudged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from inferway.controllers.rollout.config import AgreementCheck, RolloutConfig
from inferway.controllers.rollout.evidence import MirrorCounts, VersionCounts, WindowSample
from inferway.gateway.agreement_source import AgreementSource
from inferway.gateway.rollouts.backend_source import BackendMetricsSource
from inferway.gateway.rollouts.envoy_stats import EnvoyStatsSource, ScrapeError
from inferway.gateway.rollouts.prometheus_source import PrometheusSource
from inferway.policies.model import Policy
from inferway.resolve.endpoints import resolve_endpoints
from inferway.state import State

__all__ = ["RolloutSource", "build_rollout_source"]


class WindowSource(Protocol):
    """Envoy's counts a window at a time: one Envoy's admin, Prometheus, or the fleet's."""

    async def sample(self) -> WindowSample | None: ...


FleetWindows = Callable[[str, str], WindowSource]
"""(stable, canary) -> the fleet's windows for that pair (``gateway/fleet/envoy_reports``)."""


class RolloutSource:
    def __init__(
        self,
        stats: WindowSource,
        agreement: AgreementSource | None = None,
        backend: BackendMetricsSource | None = None,
    ) -> None:
        self.stats = stats
        self.agreement = agreement
        self.backend = backend
        self._pending = MirrorCounts()
        self._held: WindowSample | None = None

    async def sample(self) -> WindowSample | None:
        window = await self.stats.sample()
        if window is not None and self._held is not None:
            window, self._held = self._held.plus(window), None
        try:
            backend = await self.backend.sample() if self.backend is not None else None
            if self.agreement is not None:
                polled = await self.agreement.poll()
                self._pending.add(polled.mirror)
                if polled.unreachable:
                    raise ScrapeError(
                        "output records unreachable: " + "; ".join(polled.unreachable)
                    )
        except ScrapeError:
            self._held = window if window is not None else self._held
            raise
        if window is None:
            return None
        mirror, self._pending = self._pending, MirrorCounts()
        stable, canary = backend if backend is not None else (VersionCounts(), VersionCounts())
        return WindowSample(window.stable, window.canary, mirror, stable, canary)


def _urls(policy: Policy | None, state: State, service: str) -> list[str]:
    for candidate in policy.services if policy is not None else ():
        if candidate.name == service:
            return [
                f"http://[{e.host}]:{e.port}" if ":" in e.host else f"http://{e.host}:{e.port}"
                for e in resolve_endpoints(candidate, state)
            ]
    return []


Live = Callable[[], tuple[Policy | None, State]]
"""The live policy and State, read when they are needed (endpoints move)."""


def _window_source(
    config: RolloutConfig,
    policy: Policy | None,
    envoy_admin_port: Callable[[], int | None],
    fleet: FleetWindows | None,
) -> WindowSource:
    for rollout in policy.rollouts if policy is not None else ():
        if rollout.name == config.name and rollout.analysis.prometheus is not None:
            return PrometheusSource(
                rollout.analysis.prometheus,
                stable=config.stable,
                canary=config.canary,
                interval_s=config.analysis.interval_s,
                llm=config.needs_llm_metrics,
            )
    if fleet is not None:
        return fleet(config.stable, config.canary)
    return EnvoyStatsSource(envoy_admin_port, stable=config.stable, canary=config.canary)


def build_rollout_source(
    config: RolloutConfig,
    policy: Policy | None,
    state: State,
    envoy_admin_port: Callable[[], int | None],
    *,
    live: Live | None = None,
    fleet: FleetWindows | None = None,
) -> RolloutSource:
    """The source for ``config``: Envoy's stats or Prometheus, as the policy's rollout of
    that name says, the replicas' answer digests when it has an output-agreement check
    (the replicas as the live policy and state name them now), and their ``/metrics`` when
    it has a ``backend-*`` check (the endpoints ``live`` names at each scrape; without it,
    those of ``policy`` and ``state``). ``fleet``: Envoy's counts are every Envoy's, as they
    pushed them, instead of one Envoy's admin."""
    stats = _window_source(config, policy, envoy_admin_port, fleet)
    backend = None
    if config.needs_backend_metrics:
        now = live if live is not None else (lambda: (policy, state))
        backend = BackendMetricsSource(
            lambda service: _urls(*now(), service), stable=config.stable, canary=config.canary
        )
    agreement = None
    if any(isinstance(c, AgreementCheck) for c in config.analysis.checks):
        agreement = AgreementSource(
            stable=_urls(policy, state, config.stable), canary=_urls(policy, state, config.canary)
        )
    return RolloutSource(stats, agreement, backend)
