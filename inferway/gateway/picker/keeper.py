"""Runs inferway's endpoint pickers while the live policy has services with ``picker:`` (not
``external``): one gRPC server per ``listen`` address, one pool per service, each pool's
replicas kept to the resolved endpoints and scraped for load every ``scrape_interval``. With
``process: sidecar`` that address is served by a supervised picker process instead
(sidecar.py), fed the same resolved pools.

A pool survives an edit that changes neither its settings nor its service (its in-flight
counts and prefix index stay); new settings start a fresh picker.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.gateway.picker.core.metrics import ServerMetrics, parse_metrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.scorers import Weights
from inferway.gateway.picker.server import PickerServer, PoolPicker
from inferway.gateway.picker.sidecar import PickerSidecar
from inferway.policies.model import Policy
from inferway.policies.picker import Picker as PickerPolicy
from inferway.policies.types import split_host_port
from inferway.resolve import resolve_policy
from inferway.state.model import State

__all__ = ["PickerKeeper", "Wanted", "endpoint_address", "picker_config"]

log = logging.getLogger(__name__)

Wanted = dict[tuple[str, int], dict[str, tuple[PickerPolicy, list[str]]]]
"""Listen address -> service -> (its picker settings, its replicas as ``ip:port``)."""


def endpoint_address(host: str, port: int) -> str:
    """GAIE's ``ip:port`` (an IPv6 address in brackets), as Envoy's override_host reads it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def picker_config(policy: PickerPolicy) -> PickerConfig:
    s = policy.scorers
    return PickerConfig(
        weights=Weights(
            queue=s.queue, kv_cache=s.kv_cache, prefix=s.prefix, lora=s.lora, session=s.session
        ),
        queue_limit=policy.queue_limit,
        kv_cache_limit=policy.kv_cache_limit,
        fallbacks=policy.fallbacks,
        shed=policy.shed,
    )


@dataclass
class _Pool:
    settings: PickerPolicy
    pool: PoolPicker
    endpoints: list[str]


class PickerKeeper(PolicyFollower):
    def __init__(
        self, plane: ControlPlane | None, policy: Policy | None, state: State | None = None
    ) -> None:
        """Follows ``plane`` (None: only ``follow``/``serve`` calls) from ``policy`` on (None:
        nothing until told), once started."""
        self._plane = plane
        self._initial = policy
        self._state = state
        self.servers: dict[tuple[str, int], PickerServer] = {}
        self.sidecars: dict[tuple[str, int], PickerSidecar] = {}
        self._pools: dict[str, _Pool] = {}
        self._scraper: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[None] | None = None
        self._client = httpx.AsyncClient(trust_env=False)

    def pool(self, service: str) -> PoolPicker | None:
        entry = self._pools.get(service)
        return None if entry is None else entry.pool

    def status(self) -> dict[str, Any]:
        """Per picked service: each endpoint's queue depth, in flight, KV-cache use, picks and
        prefix-hit rate, and the last pick's explanation (``GET /status``'s ``pickers``)."""
        return {
            service: {
                "endpoints": entry.pool.picker.stats(),
                "last_pick": entry.pool.recent[-1] if entry.pool.recent else None,
            }
            for service, entry in sorted(self._pools.items())
        }

    async def follow(self, policy: Policy) -> None:
        state = self._plane.state if self._plane is not None else self._state
        services = {
            s.name: s
            for s in resolve_policy(policy, state).services
            if s.picker is not None and not s.picker.external
        }
        settings = {s.name: s.picker for s in policy.services if s.name in services}
        here: Wanted = {}
        away: Wanted = {}
        for name, service in services.items():
            own = settings[name]
            assert own is not None  # resolved with a picker: the policy has one
            endpoints = [
                endpoint_address(e.host, e.port) for e in service.endpoints if _is_ip(e.host)
            ]
            wanted = away if own.process == "sidecar" else here
            wanted.setdefault(split_host_port(own.listen), {})[name] = (own, endpoints)
        for address in list(self.sidecars):
            if address not in away:
                await self.sidecars.pop(address).stop()
        for address, pools in away.items():
            if address in here:  # one address, two processes: the sidecar cannot bind it
                log.error("picker %s:%d: services disagree on process; sidecar wins", *address)
                del here[address]
            if address not in self.sidecars:
                self.sidecars[address] = await PickerSidecar(*address).start()
            self.sidecars[address].update(pools)
        await self.serve(here)

    async def serve(self, wanted: Wanted) -> None:
        """Serve exactly ``wanted`` in this process: listen address -> service -> (settings,
        its replicas as ``ip:port``). A sidecar process runs this too."""
        addresses: dict[tuple[str, int], dict[str, PoolPicker]] = {}
        for address, pools in wanted.items():
            for name, (settings, endpoints) in pools.items():
                addresses.setdefault(address, {})[name] = self._entry(name, settings, endpoints)
        names = {name for pools in wanted.values() for name in pools}
        self._pools = {n: p for n, p in self._pools.items() if n in names}
        for address in list(self.servers):
            if address not in addresses:
                await self.servers.pop(address).stop()
        for address, served in addresses.items():
            if address not in self.servers:
                self.servers[address] = await PickerServer(*address).start()
            self.servers[address].pools = served
        if addresses and self._scraper is None:
            self._scraper = asyncio.get_running_loop().create_task(self._scrape_forever())

    def _entry(self, name: str, settings: PickerPolicy, endpoints: list[str]) -> PoolPicker:
        entry = self._pools.get(name)
        if entry is None or entry.settings != settings:
            picker = Picker(picker_config(settings))
            entry = _Pool(settings, PoolPicker(picker, settings.session_header), endpoints)
            self._pools[name] = entry
        entry.endpoints = endpoints
        entry.pool.picker.set_endpoints(endpoints)
        return entry.pool

    async def _scrape_forever(self) -> None:
        while self._pools:
            interval = min(p.settings.scrape_interval for p in self._pools.values())
            await asyncio.gather(*(self._scrape(p) for p in list(self._pools.values())))
            await asyncio.sleep(interval)
        self._scraper = None

    async def _scrape(self, entry: _Pool) -> None:
        path = entry.settings.metrics_path
        if path is None:
            return
        timeout = entry.settings.scrape_interval

        async def one(endpoint: str) -> None:
            try:
                answer = await self._client.get(f"http://{endpoint}{path}", timeout=timeout)
                metrics = parse_metrics(answer.text) if answer.status_code == 200 else None
            except (httpx.HTTPError, ValueError) as error:
                log.debug("picker: scraping %s%s: %s", endpoint, path, error)
                metrics = None
            # unknown (no metrics endpoint, down): the picker's own in-flight count decides
            entry.pool.picker.observe(endpoint, metrics or ServerMetrics())

        await asyncio.gather(*(one(e) for e in entry.endpoints))

    async def start(self) -> None:
        """Serve what the live policy asks for, then follow the control plane's applies."""
        if self._initial is not None:
            await self.follow(self._initial)
        if self._plane is not None:
            self._plane.add_observer(self)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._pending = asyncio.get_running_loop().create_task(self._follow(applied.policy))

    async def _follow(self, policy: Policy) -> None:
        try:
            await self.follow(policy)
        except OSError as error:  # Envoy applies each service's fail mode until an edit fixes it
            log.error("%s; picker services fail open or closed as their policy says", error)

    async def stop(self) -> None:
        if self._pending is not None:
            await self._pending
        if self._scraper is not None:
            self._scraper.cancel()
            await asyncio.gather(self._scraper, return_exceptions=True)
            self._scraper = None
        for server in self.servers.values():
            await server.stop()
        self.servers.clear()
        for sidecar in self.sidecars.values():
            await sidecar.stop()
        self.sidecars.clear()
        await self._client.aclose()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
