"""The autoscaling loop at the edge: Envoy's stats in, the pure Autoscaler's Decision out,
``ReplicaManager.scale_to`` acting on it.

Every ``sampling_interval`` of a service with ``autoscale:`` the driver reads that cluster's
``upstream_rq_total`` (a running total: its difference over the interval is the request rate)
and ``upstream_rq_active`` (requests in flight) from Envoy's admin ``/stats?format=json``,
feeds a MetricSample to the service's Autoscaler and scales to the Decision. Each Decision is
logged as one structured event and kept in a bounded history that ``GET /autoscale`` shows. A
scrape that fails skips the decision (the count holds) and is reported, never guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from inferway.gateway.actuators.attach import attach_replica_manager
from inferway.gateway.actuators.replicas import ReplicaManager, UnknownServiceError
from inferway.gateway.autoscale_policy import build_config
from inferway.gateway.control_plane import AppliedPolicy, ControlPlane
from inferway.gateway.controllers.autoscale.autoscaler import Autoscaler
from inferway.gateway.controllers.autoscale.config_reader import AutoscaleConfigError
from inferway.gateway.controllers.autoscale.params import AutoscaleConfig
from inferway.gateway.controllers.autoscale.samples import MetricSample
from inferway.policies.model import Policy

__all__ = [
    "AutoscaleDriver",
    "ClusterLoad",
    "StatsError",
    "parse_cluster_load",
    "start_replica_autoscaling",
]

log = logging.getLogger(__name__)


class StatsError(Exception):
    """Envoy's stats could not be read; the message says why."""


@dataclass(frozen=True)
class ClusterLoad:
    requests_total: int
    active: int


def parse_cluster_load(stats: Mapping[str, Any], cluster: str) -> ClusterLoad:
    """``cluster``'s request total and in-flight count from ``/stats?format=json``; a cluster
    Envoy does not list yet (no snapshot, no request) reads as zero."""
    entries = stats.get("stats")
    if not isinstance(entries, list):
        raise StatsError("Envoy's /stats?format=json has no 'stats' list")
    wanted = {
        f"cluster.{cluster}.upstream_rq_total": "total",
        f"cluster.{cluster}.upstream_rq_active": "active",
    }
    found = {"total": 0, "active": 0}
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") in wanted:
            value = entry.get("value")
            if isinstance(value, int | float) and not isinstance(value, bool):
                found[wanted[entry["name"]]] = int(value)
    return ClusterLoad(found["total"], found["active"])


class _Scaled:
    """One autoscaled service: its Autoscaler and the last total (for the rate)."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self.autoscaler = Autoscaler(config)
        self.last: tuple[float, int] | None = None
        self.next_at = 0.0
        self.error: str | None = None


class AutoscaleDriver:
    """Follows the live policy (a control-plane observer), samples and decides per service.
    ``start()`` runs the loop; ``stop()`` ends it. ``tick(now)`` is one pass (tests call it)."""

    def __init__(
        self,
        manager: ReplicaManager,
        envoy_admin_port: Callable[[], int | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        keep: int = 256,
        host: str = "127.0.0.1",
    ) -> None:
        self.manager = manager
        self._admin_port = envoy_admin_port
        self._clock = clock
        self._host = host
        self._services: dict[str, _Scaled] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.on_decision: list[Callable[[dict[str, Any]], None]] = []

    # -- policy ------------------------------------------------------------------------------

    def on_applied(self, applied: AppliedPolicy, _changed: bool) -> None:
        self.configure(applied.policy)

    def configure(self, policy: Policy) -> None:
        """A changed block starts a fresh Autoscaler (its history was for other rules)."""
        wanted: dict[str, AutoscaleConfig] = {}
        for service in policy.services:
            if service.autoscale is None or service.replicas is None:
                continue
            try:
                wanted[service.name] = build_config(service.name, service.autoscale)
            except AutoscaleConfigError as error:  # the loader refuses it; never a crash here
                log.warning("autoscale of %s ignored: %s", service.name, error)
        for name in list(self._services):
            if name not in wanted:
                del self._services[name]
        for name, config in wanted.items():
            current = self._services.get(name)
            if current is None or current.config != config:
                self._services[name] = _Scaled(config)

    # -- the loop ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5.0), trust_env=False
        )
        self._task = asyncio.create_task(self._run(), name="autoscale")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            try:
                await self.tick(self._clock())
            except Exception:  # one bad pass must not end autoscaling
                log.exception("autoscale pass failed")
            await asyncio.sleep(self._sleep_s())

    def _sleep_s(self) -> float:
        if not self._services:
            return 1.0
        now = self._clock()
        soonest = min(s.next_at for s in self._services.values())
        return min(max(soonest - now, 0.05), 1.0)

    async def tick(self, now: float) -> None:
        """Sample and decide for every service whose interval is due at ``now``."""
        due = [s for s in self._services.values() if s.next_at <= now]
        if not due:
            return
        try:
            stats = await self._stats()
        except StatsError as error:
            for scaled in due:
                scaled.error = str(error)
                scaled.next_at = now + scaled.config.sampling_interval_s
            log.warning("autoscale: %s", error)
            return
        for scaled in due:
            scaled.next_at = now + scaled.config.sampling_interval_s
            scaled.error = None
            self._decide(scaled, parse_cluster_load(stats, scaled.config.service), now)

    async def _stats(self) -> Mapping[str, Any]:
        port = self._admin_port()
        if port is None:
            raise StatsError("no Envoy admin port is known (Envoy not started?)")
        url = f"http://{self._host}:{port}/stats"
        params = {"format": "json", "filter": r"^cluster\.[^.]+\.upstream_rq_(total|active)$"}
        if self._session is None:
            raise StatsError("the driver is not started")
        try:
            async with self._session.get(url, params=params) as response:
                if response.status != 200:
                    raise StatsError(f"Envoy admin {url} answered {response.status}")
                data = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise StatsError(f"Envoy admin {url}: {exc or type(exc).__name__}") from None
        if not isinstance(data, dict):
            raise StatsError(f"Envoy admin {url}: not a JSON object")
        return data

    def _decide(self, scaled: _Scaled, load: ClusterLoad, now: float) -> None:
        service = scaled.config.service
        rate = None
        if (
            scaled.last is not None
            and now > scaled.last[0]
            and load.requests_total >= scaled.last[1]
        ):
            rate = (load.requests_total - scaled.last[1]) / (now - scaled.last[0])
        scaled.last = (now, load.requests_total)
        scaled.autoscaler.observe(
            MetricSample(time=now, in_flight=float(load.active), request_rate=rate)
        )
        status = {s.service: s for s in self.manager.status()}.get(service)
        if status is None:
            return
        decision = scaled.autoscaler.decide(now, current=status.desired, ready=status.ready)
        if decision.desired != status.desired:
            try:
                self.manager.scale_to(service, decision.desired, decision.reason)
            except UnknownServiceError as error:
                log.warning("autoscale: %s", error)
        event = {"wall_time": time.time(), **decision.to_dict()}
        self.history.append(event)
        log.info("autoscale decision %s", json.dumps(event, sort_keys=True, default=str))
        for hook in self.on_decision:
            hook(event)

    # -- what is shown -----------------------------------------------------------------------

    def desired(self) -> dict[str, int]:
        """Service -> the replica count its last decision asked for."""
        out: dict[str, int] = {}
        for name, scaled in sorted(self._services.items()):
            last = scaled.autoscaler.last_decision
            if last is not None:
                out[name] = last.desired
        return out

    def status_json(self) -> dict[str, Any]:
        """``GET /autoscale``: per service its rule and last decision, every decision kept,
        and the replica manager's status."""
        services = []
        for name, scaled in sorted(self._services.items()):
            last = scaled.autoscaler.last_decision
            services.append(
                {
                    "service": name,
                    "algorithm": scaled.config.algorithm,
                    "metric": scaled.config.metric,
                    "sampling_interval_s": scaled.config.sampling_interval_s,
                    "last_decision": None if last is None else last.to_dict(),
                    "error": scaled.error,
                }
            )
        return {
            "services": services,
            "decisions": list(self.history),
            "replicas": self.manager.status_json(),
        }


def start_replica_autoscaling(
    plane: ControlPlane,
    *,
    workdir: Path | None,
    envoy_admin_urls: list[str],
    envoy_admin_port: Callable[[], int | None],
) -> tuple[ReplicaManager | None, AutoscaleDriver | None]:
    """The replica manager and its autoscaling loop, when a service of the live policy has
    ``replicas:`` (else neither). A replica leaves only once the Envoys at
    ``envoy_admin_urls`` no longer list it; logs go to ``<workdir>/replicas``."""
    policy = plane.policy
    if policy is None or not any(s.replicas is not None for s in policy.services):
        return None, None
    log_dir = workdir / "replicas" if workdir is not None else None
    manager = attach_replica_manager(plane, envoy_admin_urls=envoy_admin_urls, log_dir=log_dir)
    driver = AutoscaleDriver(manager, envoy_admin_port)
    driver.configure(policy)
    plane.add_observer(driver)
    return manager, driver
