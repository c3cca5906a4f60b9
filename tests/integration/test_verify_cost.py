"""verify's cost and utilisation read-out from a real Prometheus scraping a metrics
endpoint (and from that endpoint directly, as from the admin API's /metrics): the
``inferway_cost_*`` and utilisation series are reported and the utilisation bar judged; a
source without them, or none at all, is "not available", never a failure."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from inferway.tools.verify.cost import read_cost
from tests.aiohttp_sites import start_site
from tests.helpers import poll_until
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.integration

METRICS = """\
# TYPE inferway_cost_per_1k_tokens gauge
inferway_cost_per_1k_tokens{service="gpu-pool"} 0.012
# TYPE inferway_backend_utilization gauge
inferway_backend_utilization{replica="a"} 0.8
inferway_backend_utilization{replica="b"} 0.7
# TYPE inferway_other gauge
inferway_other 1
"""


async def _metrics_server(text: str) -> tuple[web.AppRunner, int]:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return await start_site(app)


@pytest.mark.needs_binary("prometheus", "verify's cost read-out from a real Prometheus")
async def test_cost_and_utilisation_from_prometheus_and_from_metrics_text(tmp_path: Path) -> None:
    runner, port = await _metrics_server(METRICS)
    try:
        async with PrometheusServer(
            tmp_path / "prom", targets=[f"127.0.0.1:{port}"], metrics_path="/metrics"
        ) as prometheus:

            async def scraped() -> object:
                report = await asyncio.to_thread(read_cost, prometheus.url, None)
                return report if len(report.utilization) == 2 and report.cost else None

            report = await poll_until(scraped, timeout=20, what="the series in Prometheus")
            assert report.source == prometheus.url
            assert [(s.name, s.labels["service"], s.value) for s in report.cost] == [
                ("inferway_cost_per_1k_tokens", "gpu-pool", 0.012)
            ]
            assert report.mean_utilization == pytest.approx(0.75)
            assert report.ok is None  # no bar asked for
        direct = await asyncio.to_thread(
            read_cost, None, f"http://127.0.0.1:{port}", min_utilization=0.7
        )
        assert {s.name for s in direct.utilization} == {"inferway_backend_utilization"}
        assert direct.ok is True
        strict = await asyncio.to_thread(
            read_cost, None, f"http://127.0.0.1:{port}", min_utilization=0.9
        )
        assert strict.ok is False
    finally:
        await runner.cleanup()


async def test_no_cost_series_or_no_source_is_not_available_not_a_failure() -> None:
    runner, port = await _metrics_server("# TYPE up gauge\nup 1\n")
    try:
        empty = await asyncio.to_thread(
            read_cost, None, f"http://127.0.0.1:{port}", min_utilization=0.7
        )
        assert empty.note.startswith("not available") and empty.ok is None
    finally:
        await runner.cleanup()
    gone = await asyncio.to_thread(read_cost, f"http://127.0.0.1:{port}", None)
    assert gone.note.startswith("not available") and gone.ok is None
    assert read_cost(None, None).note == "not available: give --prometheus or --admin"
