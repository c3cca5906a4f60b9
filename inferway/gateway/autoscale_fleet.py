"""The autoscaling loop on a fleet: it runs on the elected replica only, decides from every
Envoy's pushed stats, and keeps its state in the store so that a new leader continues it.

:class:`AutoscaleFleet` is what the driver (gateway/autoscaling.py) calls on a fleet: the
services' loads summed over the Envoys (:class:`FleetLoadSource`), the record of each decision
written (fenced, compare-and-set) before the decision is acted on, and the state a new leader
resumes from: the autoscaler's samples, stabilization windows, cooldowns and PID terms, the
load source's per-Envoy baselines and the previous sample, so the first decision of a new
leader is the next one of the same sequence, on the same evidence. A decision whose record the
store refused (another replica leads, or wrote first) is not acted on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.params import AutoscaleConfig
from inferway.gateway.autoscale_inputs import ClusterLoad
from inferway.gateway.fleet.fleet_load import FleetLoad, FleetLoadSource
from inferway.gateway.fleet.shared_autoscale import SharedAutoscaleStore
from inferway.gateway.fleet.store import ConflictError, Fence, FencedError, StoreUnavailableError
from inferway.policies.scale_target import ScaleTargetSpec


class _Scaled(Protocol):
    """What this module reads and writes of one autoscaled service (the driver's record)."""

    config: AutoscaleConfig
    target: ScaleTargetSpec
    autoscaler: Autoscaler
    last: tuple[float, ClusterLoad] | None
    p99: float | None
    seq: int
    version: int
    error: str | None


__all__ = ["AutoscaleFleet"]

log = logging.getLogger(__name__)


def _fingerprint(scaled: _Scaled) -> str:
    """Same rules, same target: a changed block starts afresh, as on one node."""
    return hashlib.sha256(repr((scaled.config, scaled.target)).encode()).hexdigest()[:16]


def _load_json(last: tuple[float, ClusterLoad] | None) -> dict[str, Any] | None:
    if last is None:
        return None
    at, load = last
    return {
        "time": at,
        "requests_total": load.requests_total,
        "active": load.active,
        "buckets": [[str(le), n] for le, n in sorted(load.buckets.items())],
        "healthy": load.healthy,
    }


def _load(data: dict[str, Any] | None) -> tuple[float, ClusterLoad] | None:
    if data is None:
        return None
    buckets = {float(le): int(n) for le, n in data["buckets"]}
    load = ClusterLoad(int(data["requests_total"]), int(data["active"]), buckets, data["healthy"])
    return float(data["time"]), load


class AutoscaleFleet:
    def __init__(
        self,
        source: FleetLoadSource,
        state: SharedAutoscaleStore,
        fence: Callable[[], Fence | None],
    ) -> None:
        self.source = source
        self.state = state
        self._fence = fence
        self.refused = 0
        """Decisions not acted on because the store refused their record."""

    def loads(self, services: Iterable[str]) -> dict[str, FleetLoad]:
        """Each service's fleet load now (raises StatsError when no Envoy reports)."""
        return {service: self.source.load(service) for service in services}

    def restore(self, name: str, scaled: _Scaled) -> bool:
        """Continue ``scaled`` from the store's record of ``name`` (True), unless there is
        none or it was made under other rules."""
        found = self.state.load(name)
        if found is None:
            return False
        record, version = found
        scaled.version = version  # the next write expects it, even from a fresh start
        if record.get("fingerprint") != _fingerprint(scaled):
            return False
        try:
            scaled.autoscaler.restore_state(record["autoscaler"])
            if record.get("source") is not None:
                self.source.restore_state(name, record["source"])
            scaled.last = _load(record.get("last"))
            scaled.p99 = record.get("p99")
            scaled.seq = int(record["seq"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("autoscale %s: stored state not usable, starting afresh: %s", name, exc)
            return False
        return True

    async def resume(self, services: Mapping[str, _Scaled]) -> None:
        """A new leader: the store's records, read now, then each service continued."""
        try:
            await self.state.refresh()
        except StoreUnavailableError as exc:
            log.warning("autoscale: reading the fleet's state: %s", exc)
        for name, scaled in services.items():
            if self.restore(name, scaled):
                log.info("autoscale %s: continuing decision %d of the fleet", name, scaled.seq)

    async def record(self, scaled: _Scaled, event: dict[str, Any]) -> bool:
        """Write the decision ``event`` with the state it leaves, before it is acted on; False
        (do not act) when the store refused it."""
        name = scaled.config.service
        fence = self._fence()
        event["seq"] = scaled.seq + 1
        if fence is not None:
            event["term"], event["by"] = fence.term, fence.identity
        state = {
            "seq": scaled.seq + 1,
            "fingerprint": _fingerprint(scaled),
            "autoscaler": scaled.autoscaler.export_state(),
            "source": self.source.export_state(name),
            "last": _load_json(scaled.last),
            "p99": scaled.p99,
            "event": event,
        }
        try:
            scaled.version = await self.state.save(name, state, expect=scaled.version)
        except FencedError as exc:
            why = f"not recorded, this replica no longer leads: {exc}"
        except ConflictError as exc:
            why = f"another replica recorded a decision first ({exc}); continuing from it"
        except StoreUnavailableError as exc:
            why = f"not recorded, the store is unavailable: {exc}"
        else:
            scaled.seq += 1
            return True
        self.refused += 1
        scaled.error = f"decision {scaled.seq + 1} not acted on: {why}"
        log.warning("autoscale %s: %s", name, scaled.error)
        self._rewind(name, scaled)
        return False

    def _rewind(self, name: str, scaled: _Scaled) -> None:
        """Back to the last recorded state: a decision that was not recorded never happened
        (its cooldown and stabilization entries go with it)."""
        if not self.restore(name, scaled):
            scaled.autoscaler = Autoscaler(scaled.config)
            scaled.last = None

    def recorded_events(self) -> list[dict[str, Any]]:
        """The last recorded decision of every service (what any replica shows)."""
        events = []
        for name in self.state.services():
            found = self.state.load(name)
            if found is not None and isinstance(found[0].get("event"), dict):
                events.append(found[0]["event"])
        return events
