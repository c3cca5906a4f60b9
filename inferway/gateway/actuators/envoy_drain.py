"""Has Envoy stopped routing to a replica? Asked of Envoy's admin ``/clusters``.

The replica manager removes a replica from the endpoints first and stops its process only
once every Envoy it knows answers here that it no longer routes to it: the host is gone
from the service's cluster (the translator sets ``ignore_health_on_host_removal``, so a
removed host leaves at once instead of lingering while it passes health checks). A host
still listed is not drained, even with no request active at that instant: it may get the
next one. Its ``rq_active`` is kept for the drain event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["EnvoyDrainProbe", "HostLoad", "read_host_load"]


@dataclass(frozen=True)
class HostLoad:
    """One host as an Envoy admin reports it; ``listed`` False: not in the cluster."""

    listed: bool
    rq_active: int = 0


def read_host_load(clusters: Mapping[str, Any], cluster: str, host: str, port: int) -> HostLoad:
    """Pure: the host's entry in a ``/clusters?format=json`` document."""
    for status in clusters.get("cluster_statuses", []) or []:
        if not isinstance(status, dict) or status.get("name") != cluster:
            continue
        for entry in status.get("host_statuses", []) or []:
            address = entry.get("address", {}).get("socket_address", {})
            if address.get("address") != host or int(address.get("port_value", 0)) != port:
                continue
            stats = {s.get("name"): int(s.get("value", 0)) for s in entry.get("stats", [])}
            return HostLoad(True, stats.get("rq_active", 0))
    return HostLoad(False)


class EnvoyDrainProbe:
    """``await probe(service, host, port)`` -> True once no Envoy admin in ``admin_urls``
    lists the host as routable. An admin that cannot be reached answers "not drained" (the
    manager's drain timeout bounds the wait)."""

    def __init__(self, admin_urls: Sequence[str]) -> None:
        self.admin_urls = list(admin_urls)
        self.last_active: dict[tuple[str, int], int] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, service: str, host: str, port: int) -> bool:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        for url in self.admin_urls:
            try:
                async with self._session.get(
                    url.rstrip("/") + "/clusters", params={"format": "json"}
                ) as response:
                    if response.status != 200:
                        return False
                    document = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                return False
            load = read_host_load(document, service, host, port)
            self.last_active[(host, port)] = load.rq_active
            if load.listed:
                return False
        return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
