"""One scrape of one model server's load metrics (``GET http://ENDPOINT/PATH``), shared by the
pickers' pools (pools.py) and the gateway's watch over ``process: envoy`` replicas
(in_envoy.py)."""

from __future__ import annotations

import logging

import httpx

from inferway.gateway.picker.core.metrics import ServerMetrics, parse_metrics

__all__ = ["scrape_metrics"]

log = logging.getLogger(__name__)


async def scrape_metrics(
    client: httpx.AsyncClient, endpoint: str, path: str, timeout: float
) -> ServerMetrics | None:
    """``endpoint``'s metrics (``ip:port``), or None when they cannot be read (down, not a
    200, not Prometheus' text): unknown, which no scorer or gate reads as idle or as full."""
    try:
        answer = await client.get(f"http://{endpoint}{path}", timeout=timeout)
        return parse_metrics(answer.text) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as error:
        log.debug("picker: scraping %s%s: %s", endpoint, path, error)
        return None
