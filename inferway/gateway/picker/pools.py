"""The pickers one process serves: one gRPC server per listen address (and, for ``transport:
http``, one HTTP lane server per ``http_listen`` address: http_lane.py), one pool per service,
each pool's replicas kept to the endpoints it is given and scraped for load every
``scrape_interval``. The gateway's keeper (keeper.py) runs one for the addresses it serves
itself; a sidecar picker process (``process: sidecar``) runs one for its address. Kept free
of the control plane's imports so that a picker process starts (and restarts) fast.

A pool survives an update that changes neither its settings nor its service (its in-flight
counts and prefix index stay); new settings start a fresh picker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from inferway.gateway.picker.core.metrics import ServerMetrics
from inferway.gateway.picker.core.picker import Picker, PickerConfig
from inferway.gateway.picker.core.scorers import Weights
from inferway.gateway.picker.http_lane import PickerHttpServer
from inferway.gateway.picker.scrape import scrape_metrics
from inferway.gateway.picker.server import PickerServer, PoolPicker
from inferway.policies.picker import Picker as PickerPolicy
from inferway.policies.types import join_host_port, split_host_port

__all__ = ["PickerPools", "Wanted", "endpoint_address", "picker_config"]

Wanted = dict[tuple[str, int], dict[str, tuple[PickerPolicy, list[str]]]]
"""Listen address -> service -> (its picker settings, its replicas as ``ip:port``)."""


def endpoint_address(host: str, port: int) -> str:
    """GAIE's ``ip:port`` (an IPv6 address in brackets), as Envoy's override_host reads it."""
    return join_host_port(host, port)


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


def _asked(settings: PickerPolicy) -> dict[str, str]:
    """How Envoy asks this picker: its ``transport`` and the address it asks there."""
    http = settings.transport == "http"
    return {
        "transport": settings.transport,
        "address": settings.http_listen if http else settings.listen,
    }


@dataclass
class _Pool:
    settings: PickerPolicy
    pool: PoolPicker
    endpoints: list[str]


class PickerPools:
    def __init__(self) -> None:
        self.servers: dict[tuple[str, int], PickerServer] = {}
        self.http_servers: dict[tuple[str, int], PickerHttpServer] = {}
        self._pools: dict[str, _Pool] = {}
        self._scraper: asyncio.Task[None] | None = None
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
                "last_pick": entry.pool.last_explained(),
                "asked": _asked(entry.settings),
            }
            for service, entry in sorted(self._pools.items())
        }

    async def serve(self, wanted: Wanted) -> None:
        """Serve exactly ``wanted`` (what is not in it stops)."""
        addresses: dict[tuple[str, int], dict[str, PoolPicker]] = {}
        lanes: dict[tuple[str, int], dict[str, PoolPicker]] = {}
        for address, pools in wanted.items():
            for name, (settings, endpoints) in pools.items():
                pool = self._entry(name, settings, endpoints)
                addresses.setdefault(address, {})[name] = pool
                if settings.transport == "http":
                    lanes.setdefault(split_host_port(settings.http_listen), {})[name] = pool
        names = {name for pools in wanted.values() for name in pools}
        self._pools = {n: p for n, p in self._pools.items() if n in names}
        for address in list(self.servers):
            if address not in addresses:
                await self.servers.pop(address).stop()
        for address, served in addresses.items():
            if address not in self.servers:
                self.servers[address] = await PickerServer(*address).start()
            self.servers[address].pools = served
        for address in list(self.http_servers):
            if address not in lanes:
                await self.http_servers.pop(address).stop()
        for address, served in lanes.items():
            if address not in self.http_servers:
                self.http_servers[address] = await PickerHttpServer(*address).start()
            self.http_servers[address].pools = served
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
            metrics = await scrape_metrics(self._client, endpoint, path, timeout)
            # unknown (no metrics endpoint, down): the picker's own in-flight count decides
            entry.pool.picker.observe(endpoint, metrics or ServerMetrics())

        await asyncio.gather(*(one(e) for e in entry.endpoints))

    async def stop(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            await asyncio.gather(self._scraper, return_exceptions=True)
            self._scraper = None
        for server in self.servers.values():
            await server.stop()
        self.servers.clear()
        for lane in self.http_servers.values():
            await lane.stop()
        self.http_servers.clear()
        await self._client.aclose()
