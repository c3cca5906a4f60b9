"""Removing a service and the route that uses it in one edit drops no request (issue 11, bug 3):
routes stop using a cluster before it is removed, and a new cluster exists before a route uses
it, in SotW and delta, with a real Envoy under ~200 requests per second on loopback."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest

from inferway.gateway.control_plane import ControlPlane
from inferway.policies import load_policy_text
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import start_xds_server
from tests.e2e.conftest import start_version_backend
from tests.envoy_process import EnvoyProcess, free_port

pytestmark = pytest.mark.integration

NODE = "mbb-envoy"
CYCLES = 20
WORKERS = 4
PAUSE_S = 0.02  # each worker: one request, then this pause (~200 requests/s in all)


def policy_text(listener_port: int, ports: dict[str, int], *, with_canary: bool) -> str:
    canary_service = f'  - name: v2\n    endpoints: ["127.0.0.1:{ports["v2"]}"]\n'
    canary_route = (
        "  - name: canary\n"
        "    match: {path: {prefix: /canary}}\n"
        "    backends:\n"
        "      - service: v2\n"
        "        weight: 100\n"
    )
    return (
        "version: 1\n"
        "listeners:\n"
        f"  - name: edge\n    port: {listener_port}\n"
        "services:\n"
        f'  - name: v1\n    endpoints: ["127.0.0.1:{ports["v1"]}"]\n'
        f"{canary_service if with_canary else ''}"
        "routes:\n"
        f"{canary_route if with_canary else ''}"
        "  - name: models\n"
        "    match: {path: {prefix: /}}\n"
        "    backends:\n"
        "      - service: v1\n"
        "        weight: 100\n"
    )


@pytest.fixture
async def backends() -> AsyncIterator[dict[str, int]]:
    runners = []
    ports = {}
    try:
        for version in ("v1", "v2"):
            runner, port = await start_version_backend(version)
            runners.append(runner)
            ports[version] = port
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.mark.parametrize("ads", ["sotw", "delta"])
async def test_adding_and_removing_a_service_and_its_route_drops_no_request(
    ads: str, backends: dict[str, int]
) -> None:
    listener_port = free_port()
    cache = SnapshotCache()
    plane = ControlPlane(cache)
    texts = {
        added: load_policy_text(
            policy_text(listener_port, backends, with_canary=added), f"canary={added}.yaml"
        )
        for added in (False, True)
    }
    base = plane.apply_policy(texts[False], "base.yaml")
    server = await start_xds_server(cache)
    bootstrap = build_bootstrap(node_id=NODE, xds_port=server.port, admin_port=0, ads=ads)
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession) -> None:
        url = f"http://127.0.0.1:{listener_port}/canary/infer"
        while not stop.is_set():
            try:
                async with session.get(url) as response:
                    await response.read()
                    flags = response.headers.get("x-envoy-response-flags", "")
                    key = "ok" if response.status == 200 else f"{response.status} {flags}"
            except aiohttp.ClientError as error:
                key = f"error {type(error).__name__}"
            outcomes[key] += 1
            await asyncio.sleep(PAUSE_S)

    try:
        async with (
            EnvoyProcess(bootstrap),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        ):
            assert await cache.wait_for_acks(base, node_ids=[NODE], timeout=15)
            workers = [asyncio.create_task(client(session)) for _ in range(WORKERS)]
            started = time.monotonic()
            try:
                for _ in range(CYCLES):
                    for added in (True, False):
                        version = plane.apply_policy(texts[added], f"canary={added}.yaml")
                        assert await cache.wait_for_acks(version, node_ids=[NODE], timeout=10)
                        await asyncio.sleep(0.05)  # let traffic run on each config
                    assert time.monotonic() - started < 60, "the cycles took too long"
            finally:
                stop.set()
                await asyncio.gather(*workers)
    finally:
        await server.stop(0)
    assert cache.nacks() == []
    total = sum(outcomes.values())
    assert total >= CYCLES * 2 * 5, outcomes  # traffic really ran through every change
    assert outcomes == {"ok": total}, outcomes
