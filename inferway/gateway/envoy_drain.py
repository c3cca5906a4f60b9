"""Drain Envoy before it is stopped, so that stopping a gateway (``docker stop``, a pod's
deletion: SIGTERM to ``inferway run``) fails no request.

Envoy's own SIGTERM closes its listeners and every connection at once: requests in flight are
reset and a keep-alive client's next request finds nothing. Instead the keeper first asks
Envoy's admin API for ``POST /drain_listeners?graceful``: for ``--drain-time-s`` the listeners
still accept, and responses tell clients to go (HTTP/1.1 ``Connection: close``, HTTP/2
GOAWAY); then the listeners close, and each open connection is still served until its next
response closes it. The keeper waits for the open downstream connections to reach zero, at
most ``limit_s`` from the start of the drain (connections left idle by their clients would
otherwise hold it forever), and only then stops Envoy.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

__all__ = ["DRAIN_LIMIT_S", "drain_envoy", "open_downstream_connections"]

log = logging.getLogger(__name__)

DRAIN_LIMIT_S = 5.0
"""Longest drain: within Docker's default 10 s stop timeout and the manifests' 30 s grace
period, with room left to stop Envoy and the control plane."""

_POLL_S = 0.1


async def drain_envoy(
    admin_port: int, *, drain_time_s: float, limit_s: float = DRAIN_LIMIT_S
) -> int:
    """Drain Envoy's listeners; returns the downstream connections still open when it gave up
    waiting (0: all closed). An admin API that does not answer is logged, and Envoy is then
    stopped without a drain: there is nothing else to do with it."""
    base = f"http://127.0.0.1:{admin_port}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        try:
            async with session.post(f"{base}/drain_listeners?graceful") as answer:
                if answer.status != 200:
                    log.warning("envoy refused the drain (%d); stopping it now", answer.status)
                    return -1
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot drain envoy (admin 127.0.0.1:%d): %s", admin_port, error)
            return -1
        log.info("draining envoy's listeners (up to %.1fs)", limit_s)
        await asyncio.sleep(min(drain_time_s, limit_s))
        remaining = -1
        while True:
            try:
                remaining = await open_downstream_connections(session, base)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                log.warning("cannot read envoy's open connections: %s", error)
                return -1
            if remaining == 0 or loop.time() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
        if remaining:
            log.info("drain over with %d connection(s) still open", remaining)
        return remaining


async def open_downstream_connections(session: aiohttp.ClientSession, base: str) -> int:
    """Connections open on Envoy's listeners, its admin listener left out."""
    url = f"{base}/stats?format=json&filter=^listener\\..*downstream_cx_active$"
    async with session.get(url) as answer:
        answer.raise_for_status()
        body = await answer.json(content_type=None)
    stats = body.get("stats") if isinstance(body, dict) else None
    if not isinstance(stats, list):
        raise ValueError(f"{url}: no 'stats' list in the answer")
    total = 0
    for stat in stats:
        name = str(stat.get("name", ""))
        # per listener, not per worker (the per-worker gauges add up to it); not the admin's
        if name.startswith("listener.admin.") or ".worker_" in name:
            continue
        total += int(stat.get("value", 0))
    return total
