"""Evidence from every Envoy: three real Envoys (distinct node ids) push their stats to the
control plane's OTLP receiver; traffic flows through two of them only; the fleet's window is
the sum of each Envoy's own counters, says who contributed what, and names the silent one."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    add_MetricsServiceServicer_to_server,
)

from inferway.gateway.fleet.envoy_reports import (
    NODE_HEADER,
    ZONE_HEADER,
    EnvoyReports,
    FleetStatsSource,
)
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.envoy_binary import find_envoy
from tests.envoy_process import EnvoyProcess, free_port

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"  # noqa: E501
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
OTEL_SINK = "type.googleapis.com/envoy.extensions.stat_sinks.open_telemetry.v3.SinkConfig"
H2 = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _cluster(name: str, port: int, *, http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {
                            "address": "127.0.0.1", "port_value": port}}}}
                    ]
                }
            ],
        },
    }  # fmt: skip
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": H2,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _bootstrap(node: str, zone: str, listen: int, stable: int, canary: int, sink: int) -> Any:
    route = {
        "match": {"prefix": "/"},
        "route": {"weighted_clusters": {"clusters": [
            {"name": "stable", "weight": 50}, {"name": "canary", "weight": 50}]}},
    }  # fmt: skip
    manager = {
        "@type": HCM,
        "stat_prefix": "in",
        "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [route]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    grpc_service = {
        "envoy_grpc": {"cluster_name": "control_plane"},
        "initial_metadata": [
            {"key": NODE_HEADER, "value": node},
            {"key": ZONE_HEADER, "value": zone},
        ],
    }
    return {
        "node": {"id": node, "cluster": "gateway", "locality": {"zone": zone}},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "stats_flush_interval": "0.5s",
        "stats_sinks": [
            {
                "name": "envoy.stat_sinks.open_telemetry",
                "typed_config": {"@type": OTEL_SINK, "grpc_service": grpc_service},
            }
        ],
        "static_resources": {
            "listeners": [{
                "name": "public",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": manager}]}],
            }],
            "clusters": [
                _cluster("stable", stable),
                _cluster("canary", canary),
                _cluster("control_plane", sink, http2=True),
            ],
        },
    }  # fmt: skip


@pytest.fixture
async def backends() -> AsyncIterator[tuple[int, int]]:
    """A healthy stable and a canary answering every tenth request 503."""
    served = {"canary": 0}

    async def stable(_: web.Request) -> web.Response:
        return web.Response(text="stable")

    async def canary(_: web.Request) -> web.Response:
        served["canary"] += 1
        return web.Response(status=503 if served["canary"] % 10 == 0 else 200, text="canary")

    runners, ports = [], []
    for handler in (stable, canary):
        app = web.Application()
        app.router.add_get("/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        ports.append(port)
    yield ports[0], ports[1]
    for runner in runners:
        await runner.cleanup()


async def _admin_totals(envoy: EnvoyProcess) -> dict[str, tuple[int, int]]:
    stats = await envoy.get_stats(r"cluster\.(stable|canary)\.upstream_rq_(completed|5xx)$")
    return {
        c: (
            stats.get(f"cluster.{c}.upstream_rq_completed", 0),
            stats.get(f"cluster.{c}.upstream_rq_5xx", 0),
        )
        for c in ("stable", "canary")
    }


async def test_the_fleet_window_is_the_sum_of_every_envoys_own_counters(
    backends: tuple[int, int],
) -> None:
    reports = EnvoyReports()
    server = grpc.aio.server()
    add_MetricsServiceServicer_to_server(reports, server)
    sink = free_port()
    server.add_insecure_port(f"127.0.0.1:{sink}")
    await server.start()
    nodes = {"envoy-a": "zone-a", "envoy-b": "zone-b", "envoy-c": "zone-c"}
    listeners = {node: free_port() for node in nodes}
    envoys = {
        node: EnvoyProcess(_bootstrap(node, zone, listeners[node], *backends, sink))
        for node, zone in nodes.items()
    }
    try:
        for envoy in envoys.values():
            await envoy.start()
        source = FleetStatsSource(reports, "stable", "canary", silent_after_s=3.0)
        deadline = time.monotonic() + 20
        while set(reports.reports()) != set(nodes):
            assert time.monotonic() < deadline, f"reports from {sorted(reports.reports())}"
            await asyncio.sleep(0.1)
        assert await source.sample() is None  # the baseline
        before = {node: await _admin_totals(envoy) for node, envoy in envoys.items()}

        async with httpx.AsyncClient(timeout=5) as client:
            for i in range(300):  # only through a and b: c carries nothing
                node = "envoy-a" if i % 3 else "envoy-b"
                await client.get(f"http://127.0.0.1:{listeners[node]}/infer")

        after = {node: await _admin_totals(envoy) for node, envoy in envoys.items()}
        # wait for a flush that carries every count, then take one window
        want = sum(after[n][c][0] - before[n][c][0] for n in nodes for c in ("stable", "canary"))
        deadline = time.monotonic() + 10
        while True:
            await asyncio.sleep(0.6)
            pushed = sum(
                r.totals[c].requests
                for r in reports.reports().values()
                for c in ("stable", "canary")
                if c in r.totals
            )
            base = sum(before[n][c][0] for n in nodes for c in ("stable", "canary"))
            if pushed - base >= want or time.monotonic() > deadline:
                break
        window = await source.sample()
        assert window is not None and source.last_window is not None
        for version in ("stable", "canary"):
            counted = getattr(window, version)
            own = [after[n][version][0] - before[n][version][0] for n in nodes]
            own_errors = [after[n][version][1] - before[n][version][1] for n in nodes]
            assert counted.requests == sum(own), (version, counted, own)
            assert counted.errors == sum(own_errors), (version, counted, own_errors)
        assert window.stable.requests + window.canary.requests == 300
        assert window.canary.errors == window.canary.requests // 10  # every tenth canary answer
        shares = source.last_window.to_json()["contributors"]
        assert isinstance(shares, dict)
        assert (
            shares["envoy-a"]["stable"]["requests"] + shares["envoy-a"]["canary"]["requests"] == 200
        )
        assert shares["envoy-c"] == {
            "stable": {"requests": 0, "errors": 0},
            "canary": {"requests": 0, "errors": 0},
        }

        envoys["envoy-c"].stop()
        await asyncio.sleep(3.5)
        await source.sample()
        assert source.last_window.silent == ("envoy-c",)
    finally:
        for envoy in envoys.values():
            envoy.stop()
        await server.stop(None)


def test_a_bootstrap_with_a_zone_and_stats_push_passes_envoys_validation(tmp_path: Path) -> None:
    bootstrap = build_bootstrap(
        node_id="envoy-a",
        xds_port=18000,
        admin_port=0,
        locality={"zone": "zone-a", "region": "eu"},
        stats_push_s=2.0,
    )
    assert bootstrap["node"]["locality"] == {"zone": "zone-a", "region": "eu"}
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(bootstrap))
    checked = subprocess.run(
        [find_envoy(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
