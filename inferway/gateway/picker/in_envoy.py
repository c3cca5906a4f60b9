"""The gateway's watch over the replicas of ``process: envoy`` pickers: Envoy picks each
request itself and cannot see the model servers' queues or KV caches; this scrapes them every
``scrape_interval`` and hands ``publish`` what Envoy should know (the keeper puts it in the
control plane's State). No per-request work is added: a pick stays inside Envoy.

- ``pick: hash`` (prefix hash, Maglev with bounded load on Envoy's own in-flight counts): when
  a replica turns saturated or is taken back (core/saturation.py decides, with the reason),
  the replicas to leave out (Envoy gets them as DEGRADED endpoints).
- ``pick: score`` (the scoring picker in Envoy's Lua filter, which leaves saturated replicas
  out itself): each replica's queue, KV-cache use (to ``KV_STEP``) and adapters, when they
  changed (Envoy gets them in the route's metadata).

A round that fails is logged and the next one runs; the last published set stays meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.saturation import SaturationGate, SaturationLimits, queue_depth
from inferway.gateway.picker.scrape import scrape_metrics
from inferway.policies.picker import Picker as PickerPolicy
from inferway.state.model import ReplicaLoad
from inferway.xds.translate.picker_score import KV_STEP

__all__ = [
    "InEnvoyLoad",
    "Loads",
    "Publish",
    "Saturated",
    "Watched",
    "replica_load",
    "saturation_limits",
]

log = logging.getLogger(__name__)

Saturated = Mapping[str, frozenset[tuple[str, int]]]
"""Service -> the (host, port) of its replicas Envoy leaves out now."""
Loads = Mapping[str, Mapping[str, ReplicaLoad]]
"""Service -> ``ip:port`` -> its replica's load as last scraped (``pick: score`` services)."""
Publish = Callable[[Saturated, Loads], None]
Watched = dict[str, tuple[PickerPolicy, dict[str, tuple[str, int]]]]
"""Service -> (its picker settings, its replicas: ``ip:port`` -> (host, port))."""

HOLD_SCRAPES = 2
"""A saturated replica is taken back after this many scrape intervals under both limits."""


def saturation_limits(settings: PickerPolicy) -> SaturationLimits:
    return SaturationLimits(
        queue_limit=settings.queue_limit,
        kv_cache_limit=settings.kv_cache_limit,
        hold_s=HOLD_SCRAPES * settings.scrape_interval,
    )


def replica_load(metrics: ServerMetrics | None) -> ReplicaLoad:
    """What Envoy's Lua picker is told of one replica: KV-cache use to ``KV_STEP`` (a decoding
    server's moves every scrape; less would not change a pick, and would push routes for
    nothing)."""
    if metrics is None:
        return ReplicaLoad()
    kv = metrics.kv_cache
    return ReplicaLoad(
        depth=queue_depth(metrics),
        kv_cache=None if kv is None else round(round(kv / KV_STEP) * KV_STEP, 2),
        loras_running=metrics.loras_running,
        loras_waiting=metrics.loras_waiting,
        max_lora=metrics.max_lora,
    )


@dataclass
class _Service:
    settings: PickerPolicy
    gate: SaturationGate
    replicas: dict[str, tuple[str, int]]

    @property
    def scored(self) -> bool:
        """``pick: score``: Envoy's Lua picker gets the load; nothing is left out here."""
        return self.settings.pick == "score"


class InEnvoyLoad:
    def __init__(self, publish: Publish, clock: Callable[[], float] = time.time) -> None:
        self._publish = publish
        self._clock = clock
        self._services: dict[str, _Service] = {}
        self._task: asyncio.Task[None] | None = None
        self._client = httpx.AsyncClient(trust_env=False)
        self.published: dict[str, frozenset[tuple[str, int]]] = {}
        """What ``publish`` was last given (services with none left out are absent)."""
        self.published_loads: dict[str, dict[str, ReplicaLoad]] = {}
        """The loads ``publish`` was last given (``pick: score`` services)."""
        self.rounds = 0
        self.failed_rounds = 0
        self.failed_publishes = 0

    def follow(self, watched: Watched) -> None:
        """Watch exactly ``watched``: a service whose limits changed starts afresh (its
        replicas all in), one that is gone is no longer left out anywhere."""
        for name in list(self._services):
            if name not in watched:
                del self._services[name]
        for name, (settings, replicas) in watched.items():
            known = self._services.get(name)
            if known is None or known.settings != settings:
                known = self._services[name] = _Service(
                    settings, SaturationGate(saturation_limits(settings)), {}
                )
            known.replicas = dict(replicas)
            known.gate.set_endpoints(replicas)
        self._publish_if_changed()
        scraped = any(s.settings.metrics_path for s in self._services.values())
        if scraped and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch_forever())

    def status(self) -> dict[str, dict[str, Any]]:
        """Per service: each replica's last scrape (queue depth, KV-cache use), saturated and
        left out; and the recent changes with their reasons."""
        return {
            name: {
                "endpoints": service.gate.stats(),
                "changes": [asdict(c) for c in service.gate.history],
                "kept_in_saturated": service.gate.kept_in,
                "no_room": service.gate.no_room,
            }
            for name, service in sorted(self._services.items())
        }

    async def _watch_forever(self) -> None:
        while True:
            scraped = [s for s in self._services.values() if s.settings.metrics_path]
            if not scraped:
                break
            try:
                await self.watch_once()
            except Exception:  # the next round runs; the last published set stays
                self.failed_rounds += 1
                log.exception("picker (process: envoy): a scrape round failed")
            await asyncio.sleep(min(s.settings.scrape_interval for s in scraped))
        self._task = None

    async def watch_once(self) -> None:
        """Scrape every watched replica once, decide, publish when the set changed."""
        services = [s for s in self._services.values() if s.settings.metrics_path]

        async def one(service: _Service, endpoint: str) -> None:
            path = service.settings.metrics_path
            assert path is not None
            metrics = await scrape_metrics(
                self._client, endpoint, path, service.settings.scrape_interval
            )
            service.gate.observe(endpoint, metrics, self._clock())

        await asyncio.gather(*(one(s, e) for s in services for e in s.replicas))
        now = self._clock()
        for service in services:
            if service.scored:
                continue
            before = service.gate.left_out
            after = service.gate.decide(now)
            if after != before:
                log.info(
                    "picker (process: envoy): %s",
                    "; ".join(
                        f"{c.endpoint} {'left out' if c.left_out else 'taken back'}: {c.reason}"
                        for c in list(service.gate.history)[-len(after ^ before) :]
                    ),
                )
        self.rounds += 1
        self._publish_if_changed()

    def _publish_if_changed(self) -> None:
        wanted = {
            name: frozenset(s.replicas[e] for e in s.gate.left_out if e in s.replicas)
            for name, s in sorted(self._services.items())
            if not s.scored
        }
        wanted = {name: out for name, out in wanted.items() if out}
        loads = {
            name: {e: replica_load(m) for e, m in s.gate.metrics().items()}
            for name, s in sorted(self._services.items())
            if s.scored
        }
        if wanted == self.published and loads == self.published_loads:
            return
        try:
            self._publish(wanted, loads)
        except Exception as error:  # the last published set stays; the next round tries again
            self.failed_publishes += 1
            log.error("picker (process: envoy): telling Envoy the replicas' load failed: %s", error)
            return
        self.published, self.published_loads = wanted, loads

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._client.aclose()
