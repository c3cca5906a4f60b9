"""The autoscaling loop at the edge: Envoy's stats and the replicas' own metrics in, the pure
Autoscaler's Decision out, the service's scale actuator acting on it.

Every ``sampling_interval`` of a service with ``autoscale:`` the driver reads that cluster from
Envoy's admin ``/stats/prometheus`` (request rate, in flight, the interval's p99, its healthy
hosts) and, for a rule on ``queue_length``, ``queue_wait`` or ``utilization``, every ready
replica's ``/metrics`` (queue depth, busy fraction), and for a rule on ``token_rate`` the
gateway's own ``/metrics`` (the LLM tokens it counted for the service);
:mod:`inferway.gateway.autoscale_inputs` turns them into a MetricSample for the service's
Autoscaler. The counts it decides from and where the decision goes are the service's
``scale_target`` (gateway/actuators/scale_actuators.py): the gateway's replicas, the published
metric only (KEDA or an HPA act), or a Deployment's scale. Each Decision is logged as one
structured event and kept in a bounded history that ``GET /autoscale`` shows. A scrape, a read
of the counts or a scale that fails is the service's ``error`` there and in the log, never a
crash and never a guess: without counts the decision is skipped; a scale that failed is still
a decision (the metric publishes it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

from inferway import background
from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.params import AutoscaleConfig
from inferway.controllers.autoscale.samples import MetricSample
from inferway.gateway.actuators.replicas import ReplicaManager
from inferway.gateway.actuators.scale_actuators import (
    KubernetesFactory,
    ScaleActuator,
    ScaleActuatorError,
    select_actuator,
)
from inferway.gateway.admin_documents import AutoscaleDocument, AutoscaleService
from inferway.gateway.autoscale_fleet import AutoscaleFleet
from inferway.gateway.autoscale_inputs import (
    BACKEND_METRICS,
    ClusterLoad,
    StatsError,
    build_sample,
    parse_cluster_load,
    parse_token_totals,
    replica_load,
    replica_wait,
    token_rate,
)
from inferway.gateway.backend_scrape import BackendTotals, scrape_backends
from inferway.gateway.control_plane import AppliedPolicy, PolicyFollower
from inferway.gateway.fleet.fleet_load import FleetLoad
from inferway.gateway.loop_configs import LoopConfigs, compile_loops
from inferway.policies.scale_target import ScaleTargetSpec

__all__ = ["AutoscaleDriver"]

log = logging.getLogger(__name__)

_FILTER = r"^cluster\.[^.]+\.(upstream_rq_(total|active|time)|membership_healthy)$"


class _Scaled:
    """One autoscaled service: its Autoscaler, its actuator and the last total (for the rate)."""

    def __init__(
        self, config: AutoscaleConfig, target: ScaleTargetSpec, actuator: ScaleActuator
    ) -> None:
        self.config = config
        self.target = target
        self.actuator = actuator
        self.autoscaler = Autoscaler(config)
        self.last: tuple[float, ClusterLoad] | None = None
        self.replicas: dict[str, BackendTotals] | None = None
        """Each replica's /metrics at the last scrape (the queue wait is their difference)."""
        self.p99: float | None = None
        self.tokens: tuple[float, float] | None = None
        """(time, the gateway's running token total) at the last sample (token_rate)."""
        self.tokens_per_s: float | None = None
        self.ready: int | None = None
        self.next_at = 0.0
        self.error: str | None = None
        self.seq = 0
        """On a fleet: the number of the last decision recorded in the store."""
        self.version = 0
        """On a fleet: the store's version of this service's record (compare-and-set)."""


class AutoscaleDriver(PolicyFollower):
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
        kubernetes: KubernetesFactory | None = None,
        gateway_metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.manager = manager
        self._gateway_metrics = gateway_metrics
        self._kubernetes = kubernetes
        self._admin_port = envoy_admin_port
        self._clock = clock
        self._host = host
        self._services: dict[str, _Scaled] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.on_decision: list[Callable[[dict[str, Any]], None]] = []
        self.fleet: AutoscaleFleet | None = None
        """On a fleet (``use_fleet``): every Envoy's load, and the state in the store."""

    def use_fleet(self, fleet: AutoscaleFleet) -> None:
        """Decide from the fleet's load and record each decision in the store before acting
        on it; times become wall-clock seconds (replicas compare them)."""
        self.fleet = fleet
        self._clock = time.time
        for name, scaled in self._services.items():
            fleet.restore(name, scaled)

    # -- policy ------------------------------------------------------------------------------

    def on_applied(self, applied: AppliedPolicy, _changed: bool) -> None:
        self.configure(compile_loops(applied.policy))

    def configure(self, loops: LoopConfigs) -> None:
        """Follow the compiled configs of a policy: a changed block starts a fresh
        Autoscaler (its history was for other rules) and a changed target a fresh
        actuator."""
        wanted = loops.autoscale
        for name in list(self._services):
            if name not in wanted:
                del self._services[name]
        for name, scaled in wanted.items():
            config, target = scaled.config, scaled.target
            current = self._services.get(name)
            if current is None or (current.config, current.target) != (config, target):
                actuator = select_actuator(name, target, self.manager, self._kubernetes)
                self._services[name] = _Scaled(config, target, actuator)
                if self.fleet is not None:
                    self.fleet.restore(name, self._services[name])

    # -- the loop ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.fleet is not None:  # a new leader continues the fleet's decisions
            await self.fleet.resume(self._services)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5.0), trust_env=False
        )
        self._task = background.start(self._run(), name="autoscale", log=log)

    async def stop(self) -> None:
        if self._task is not None:
            await background.cancel(self._task)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        await background.repeat(
            self._tick_now, every_s=self._sleep_s, what="autoscale pass", log=log
        )

    async def _tick_now(self) -> None:
        await self.tick(self._clock())

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
        evidence: dict[str, FleetLoad] = {}
        try:
            if self.fleet is not None:
                evidence = self.fleet.loads(s.config.service for s in due)
                loads = {name: fleet_load.load for name, fleet_load in evidence.items()}
            else:
                stats = await self._stats()
                loads = {s.config.service: parse_cluster_load(stats, s.config.service) for s in due}
        except StatsError as error:
            for scaled in due:
                scaled.error = str(error)
                scaled.next_at = now + scaled.config.sampling_interval_s
            log.warning("autoscale: %s", error)
            return
        totals, token_error = self._token_totals()
        for scaled in due:
            scaled.next_at = now + scaled.config.sampling_interval_s
            scaled.error = None
            load = loads[scaled.config.service]
            queue, utilization, wait = None, None, None
            if scaled.config.metric in BACKEND_METRICS:
                queue, utilization, wait = await self._replica_load(scaled)
            tokens = self._token_rate(scaled, now, totals, token_error)
            sample = build_sample(
                now,
                load,
                scaled.last,
                queue_length=queue,
                utilization=utilization,
                queue_wait=wait,
                last_p99=scaled.p99,
                tokens_per_s=tokens,
            )
            fleet_load = evidence.get(scaled.config.service)
            if fleet_load is not None and fleet_load.rate is not None:
                sample = dataclasses.replace(sample, request_rate=fleet_load.rate)
            scaled.p99 = sample.p99_latency
            scaled.last = (now, load)
            await self._decide(
                scaled, sample, now, load.healthy, evidence.get(scaled.config.service)
            )

    async def _stats(self) -> str:
        port = self._admin_port()
        if port is None:
            raise StatsError("no Envoy admin port is known (Envoy not started?)")
        url = f"http://{self._host}:{port}/stats/prometheus"
        if self._session is None:
            raise StatsError("the driver is not started")
        try:
            async with self._session.get(url, params={"filter": _FILTER}) as response:
                if response.status != 200:
                    raise StatsError(f"Envoy admin {url} answered {response.status}")
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise StatsError(f"Envoy admin {url}: {exc or type(exc).__name__}") from None

    def _token_totals(self) -> tuple[dict[str, float] | None, str | None]:
        """Service -> the gateway's running token count, or why it cannot be read."""
        if self._gateway_metrics is None:
            return None, "token_rate needs the gateway's /metrics, which this driver lacks"
        try:
            return parse_token_totals(self._gateway_metrics().decode(errors="replace")), None
        except StatsError as error:
            return None, str(error)

    def _token_rate(
        self, scaled: _Scaled, now: float, totals: dict[str, float] | None, error: str | None
    ) -> float | None:
        """Tokens per second the gateway counted for the service since the last sample (kept
        for ``scale status`` whatever the metric); None (a token_rate decision holds) on the
        first sample, or when the gateway's metrics cannot be read (the service's error when
        it scales on them)."""
        if totals is None:
            if scaled.config.metric == "token_rate":
                scaled.error = error
            scaled.tokens = scaled.tokens_per_s = None
            return None
        total = totals.get(scaled.config.service, 0.0)
        scaled.tokens_per_s = token_rate(scaled.tokens, (now, total))
        scaled.tokens = (now, total)
        return scaled.tokens_per_s

    async def _replica_load(
        self, scaled: _Scaled
    ) -> tuple[float | None, float | None, float | None]:
        """Queue length, utilization and queue wait from the service's ready replicas; a
        replica that does not answer makes all three unknown (the decision holds) and is the
        service's error."""
        assert self._session is not None
        endpoints = self.manager.endpoints().get(scaled.config.service, ())
        urls = [
            f"http://[{e.host}]:{e.port}" if ":" in e.host else f"http://{e.host}:{e.port}"
            for e in endpoints
        ]
        scrape = await scrape_backends(self._session, urls)
        if scrape.failures:
            detail = "; ".join(f"{u}: {why}" for u, why in sorted(scrape.failures.items()))
            scaled.error = f"replica /metrics unreachable: {detail}"
            log.warning("autoscale %s: %s", scaled.config.service, scaled.error)
        queue, utilization = replica_load(scrape.totals, len(scrape.failures))
        wait = replica_wait(scaled.replicas, scrape.totals, queue)
        scaled.replicas = None if scrape.failures else dict(scrape.totals)
        return queue, utilization, wait

    async def _decide(
        self,
        scaled: _Scaled,
        sample: MetricSample,
        now: float,
        healthy: int | None,
        evidence: FleetLoad | None = None,
    ) -> None:
        service = scaled.config.service
        scaled.autoscaler.observe(sample)
        try:
            counts = await scaled.actuator.counts(service, healthy)
        except ScaleActuatorError as error:
            scaled.error = f"cannot read the current count: {error}"
            log.warning("autoscale %s: %s", service, scaled.error)
            return
        scaled.ready = counts.ready
        decision = scaled.autoscaler.decide(now, current=counts.current, ready=counts.ready)
        event = {
            "wall_time": time.time(),
            **decision.to_dict(),
            "scale_target": scaled.target.kind,
        }
        if evidence is not None:
            event["envoys"] = evidence.to_json()  # which Envoys the inputs came from
        if self.fleet is not None and not await self.fleet.record(scaled, event):
            return  # not recorded: another replica leads or decided first; never acted on
        if decision.desired != counts.current:
            try:
                await scaled.actuator.scale_to(service, decision.desired, decision.reason)
            except ScaleActuatorError as error:
                scaled.error = f"cannot scale to {decision.desired}: {error}"
                event["error"] = scaled.error
                log.warning("autoscale %s: %s", service, scaled.error)
        self.history.append(event)
        log.info("autoscale decision %s", json.dumps(event, sort_keys=True, default=str))
        for hook in self.on_decision:
            hook(event)

    # -- what is shown -----------------------------------------------------------------------

    def desired(self) -> dict[str, int]:
        """Service -> the replica count its last decision asked for, while this loop runs:
        on a fleet only the leader's loop runs, so the count is published once (a follower,
        or a deposed leader, publishes none; KEDA and the HPA read the leader's)."""
        out: dict[str, int] = {}
        if self._task is None:
            return out
        for name, scaled in sorted(self._services.items()):
            last = scaled.autoscaler.last_decision
            if last is not None:
                out[name] = last.desired
        return out

    def status_json(self) -> AutoscaleDocument:
        """``GET /autoscale`` (``admin_documents.AutoscaleDocument``): per service its rule
        and last decision, every decision kept, and the replica manager's status."""
        services: list[AutoscaleService] = []
        for name, scaled in sorted(self._services.items()):
            last = scaled.autoscaler.last_decision
            services.append(
                {
                    "service": name,
                    "algorithm": scaled.config.algorithm,
                    "metric": scaled.config.metric,
                    "sampling_interval_s": scaled.config.sampling_interval_s,
                    "scale_target": scaled.actuator.describe(),
                    "last_decision": None if last is None else last.to_dict(),
                    "error": scaled.error,
                    "tokens_per_s": scaled.tokens_per_s,
                    "tokens_per_s_per_replica": (
                        scaled.tokens_per_s / scaled.ready
                        if scaled.tokens_per_s is not None and scaled.ready
                        else None
                    ),
                }
            )
        return {
            "services": services,
            "decisions": list(self.history),
            "replicas": self.manager.status_json(),
        }
