"""The Prometheus metric source against a real Prometheus scraping a real Envoy: the counts it
returns for canary and stable are the ones Envoy served (within Prometheus' increase()
extrapolation), and a Prometheus that is down, refuses the query or has no series for a
version is a source error, never an empty window."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from aiohttp import web

from inferway.controllers.rollout.evidence import WindowSample
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.rollouts.driver import RolloutDriver
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, EnvoyStatsSource, ScrapeError
from inferway.gateway.rollouts.prometheus_source import PrometheusSource
from inferway.gateway.rollouts.sample_source import build_rollout_source
from inferway.gateway.rollouts.store import RolloutStore
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.policies import load_policy_text
from inferway.policies.rollout_prometheus import PrometheusAnalysis, PrometheusQueries
from inferway.xds.cache import SnapshotCache
from tests.aiohttp_sites import answer_every_path, start_site
from tests.e2e.conftest import render_policy
from tests.envoy_process import free_port
from tests.prometheus_server import PrometheusServer
from tests.rollout_samples import TWO_VERSION_ROLLOUT

T = TypeVar("T")

POLICY = (
    TWO_VERSION_ROLLOUT
    + """    steps: [1, 100]
    analysis: {interval: 1s, source: prometheus, prometheus: {url: PROMETHEUS_URL}}
"""
)

pytestmark = pytest.mark.needs_binary("prometheus", "the rollouts' Prometheus metric source")


async def _backend(version: str) -> tuple[web.AppRunner, int]:
    """Answers 200; the canary (v2) answers 500 on ``/fail`` (5xx for the errors query)."""

    async def answer(request: web.Request) -> web.Response:
        status = 500 if version == "v2" and request.path.endswith("/fail") else 200
        return web.json_response({"version": version}, status=status)

    return await start_site(answer_every_path(answer))


@dataclass
class Stack:
    gateway: Gateway
    prometheus: PrometheusServer
    listener_port: int
    envoy_admin_port: int


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    runners, ports = [], {}
    for version in ("v1", "v2"):
        runner, port = await _backend(version)
        runners.append(runner)
        ports[version] = port
    listener_port, envoy_admin_port = free_port(), free_port()
    path = tmp_path / "policy.yaml"
    weights: dict[str, float | str] = {"v1": 70.0, "v2": 30.0}
    path.write_text(
        render_policy(listener_port=listener_port, backend_ports=ports, weights=weights)
    )
    options = GatewayOptions(
        policy_path=path, xds_port=0, admin_port=0, envoy_admin_port=envoy_admin_port,
        workdir=tmp_path,
    )  # fmt: skip
    gateway = await start_gateway(options)
    try:
        assert gateway.supervisor is not None and await gateway.supervisor.wait_ready(20)
        version = gateway.control_plane.version
        assert version and await gateway.cache.wait_for_acks(version, timeout=10)
        target = f"127.0.0.1:{envoy_admin_port}"
        async with PrometheusServer(tmp_path / "prom", targets=[target]) as prometheus:
            yield Stack(gateway, prometheus, listener_port, envoy_admin_port)
    finally:
        await gateway.stop()
        for runner in runners:
            await runner.cleanup()


def _source(url: str, **queries: str) -> PrometheusSource:
    settings = PrometheusAnalysis(url=url, queries=PrometheusQueries(**queries), timeout=3)
    return PrometheusSource(settings, stable="v1", canary="v2", interval_s=60)


async def _deadline_poll(
    what: Callable[[], str], probe: Callable[[], Awaitable[T | None]], timeout: float = 20.0
) -> T:
    """``probe()`` until it returns something, or fail saying ``what()`` never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = await probe()
        if last is not None:
            return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what()}")


async def test_the_source_reports_the_counts_envoy_served_per_version(
    stack: Stack, tmp_path: Path
) -> None:
    prometheus = stack.prometheus

    # increase() extrapolates to the window's end by up to 1.1 mean scrape intervals past the
    # last sample, so with only a few samples in the window it can read 1.5x what was served.
    # Eight 1 s scrapes before any traffic keep that extrapolation under 1.1/7 (< 16%).
    async def baseline() -> bool | None:
        result = await prometheus.query(
            "count_over_time("
            'envoy_cluster_upstream_rq_completed{envoy_cluster_name=~"v1|v2"}[60s]) >= 8'
        )
        return True if len(result) == 2 else None

    await _deadline_poll(
        lambda: "Prometheus to scrape Envoy's clusters eight times", baseline, timeout=30.0
    )

    url = f"http://127.0.0.1:{stack.listener_port}/v2/models/demo"
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        for i in range(120):
            await client.get(url + ("/fail" if i % 4 == 0 else "/infer"))
    envoy = EnvoyStatsSource(lambda: stack.envoy_admin_port, stable="v1", canary="v2")
    served: dict[str, ClusterTotals] = await envoy.scrape()
    assert served["v1"].requests > 0 and served["v2"].requests > 0, served
    assert served["v2"].errors > 0, served  # the canary answered some 500s

    source = _source(prometheus.url)
    seen: list[WindowSample] = []

    async def caught_up() -> WindowSample | None:
        window = await source.sample()
        seen.append(window)
        canary, stable = window.canary, window.stable
        if (
            stable.requests >= served["v1"].requests
            and canary.requests >= served["v2"].requests
            and canary.errors >= served["v2"].errors
            and sum(canary.latency_ms.values()) >= served["v2"].requests  # histograms flushed
        ):
            return window
        return None

    window = await _deadline_poll(
        lambda: f"Prometheus' window to hold what Envoy served ({served}); last {seen[-1:]}",
        caught_up,
    )
    # increase() extrapolates to the window's end (< one 1 s scrape past the last sample).
    for counts, totals in ((window.stable, served["v1"]), (window.canary, served["v2"])):
        bound = math.ceil(totals.requests * 1.3) + 1
        assert totals.requests <= counts.requests <= bound, (counts, totals)
        assert totals.errors <= counts.errors <= math.ceil(totals.errors * 1.3) + 1
        assert sum(counts.latency_ms.values()) <= bound
    assert window.stable.errors == 0  # stable never failed: nothing to extrapolate
    assert window.canary.requests < window.stable.requests  # 30% vs 70%: not swapped

    # A version Prometheus has no series for is an error, not "no traffic".
    missing = PrometheusSource(source.settings, stable="v1", canary="v9", interval_s=60)
    with pytest.raises(ScrapeError, match="no requests series for canary 'v9'"):
        await missing.sample()
    # A query Prometheus refuses says so.
    bad = _source(prometheus.url, requests="sum(rate({cluster}[{interval}]")
    with pytest.raises(ScrapeError, match=r"Prometheus refused .*bad_data"):
        await bad.sample()


async def test_an_unreachable_prometheus_is_a_source_error() -> None:
    closed = free_port()
    with pytest.raises(ScrapeError, match=f"Prometheus http://127.0.0.1:{closed}/api/v1/query"):
        await _source(f"http://127.0.0.1:{closed}").sample()


async def test_a_rollout_on_an_unreachable_prometheus_pauses_with_that_reason(
    tmp_path: Path,
) -> None:
    closed = free_port()
    policy = load_policy_text(
        POLICY.replace("PROMETHEUS_URL", f"http://127.0.0.1:{closed}"), "p.yaml"
    )
    plane = ControlPlane(SnapshotCache())
    driver = RolloutDriver(
        plane,
        RolloutStore(tmp_path),
        lambda config: build_rollout_source(config, plane.policy, plane.state, lambda: None),
    )
    plane.add_observer(driver)
    plane.apply_policy(policy, "p.yaml", state=driver.resolve_state(policy, plane.state))
    for _ in range(2):
        await driver.tick("demo-v2")
    status = driver.status("demo-v2")
    assert status["phase"] == "paused" and status["paused_by"] == "source", status
    assert f"Prometheus http://127.0.0.1:{closed}/api/v1/query" in str(status["reason"]), status
    assert status["step"] == 0, "no step taken on no evidence"
    assert dict(plane.state.weights["inference"]) == {"v1": 99.0, "v2": 1.0}
