"""The autoscaler on the admin API and in Prometheus: ``GET /autoscale`` (every decision
kept, and the replicas' status) and ``inferway_autoscale_desired_replicas{service}``, read
from the driver at scrape time so it never shows a stale count."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.gateway.autoscaling import AutoscaleDriver

__all__ = [
    "AUTOSCALE",
    "AUTOSCALE_FORWARD",
    "add_autoscale_routes",
    "register_autoscale_metrics",
]

AUTOSCALE = web.AppKey("autoscale_driver", AutoscaleDriver)
AUTOSCALE_FORWARD: web.AppKey[Callable[[web.Request], Awaitable[web.Response | None]]] = web.AppKey(
    "autoscale_forward"
)
"""A fleet replica that does not lead answers with the leader's document (None: it leads)."""


async def _show(request: web.Request) -> web.Response:
    forward = request.app.get(AUTOSCALE_FORWARD)
    if forward is not None and (forwarded := await forward(request)) is not None:
        return forwarded
    document = request.app[AUTOSCALE].status_json()
    if not document["services"] and not document["replicas"]["services"]:
        # a gateway whose policy runs no replicas and autoscales nothing (now) has none to show
        return web.json_response(
            {"error": "no service of the live policy has replicas: or autoscale:"}, status=404
        )
    return web.json_response(document)


def add_autoscale_routes(app: web.Application, driver: AutoscaleDriver) -> None:
    """Before the app starts (aiohttp freezes the router then)."""
    app[AUTOSCALE] = driver
    app.router.add_get("/autoscale", _show)


class _Desired(Collector):
    def __init__(self, driver: AutoscaleDriver) -> None:
        self._driver = driver

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "inferway_autoscale_desired_replicas",
            "Replicas the autoscaler's last decision asked for, per service (what KEDA or an "
            "HPA external metric can act on).",
            labels=["service"],
        )
        for service, desired in self._driver.desired().items():
            gauge.add_metric([service], float(desired))
        yield gauge

    def describe(self) -> Iterator[Metric]:
        return iter(())


def register_autoscale_metrics(registry: CollectorRegistry, driver: AutoscaleDriver) -> None:
    registry.register(_Desired(driver))
