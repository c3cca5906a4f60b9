"""End-to-end fixtures: real version backends, a real control plane, a real Envoy, on loopback.

    async def test_x(gateway: Gateway) -> None:
        counts = await gateway.send(2000)               # {"v1": 1800, "v2": 200}
        await gateway.edit_weights(50.0, 50.0)          # file edit -> watcher -> Envoy ACK

The control plane is the production wiring, built by the composition root (``start_gateway``
as ``inferway run --no-envoy``) from a policy file in a temp dir. Envoy is the pinned binary,
started by ``tests/envoy_process.py`` with ``build_bootstrap``. Every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.runtime import Gateway as RunningGateway
from inferway.gateway.runtime import GatewayOptions, start_gateway
from inferway.gateway.watcher import PolicyWatcher
from inferway.resolve import IR
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import Resources
from inferway.xds.translate import translate
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import (  # re-exported for the tests importing them here
    poll_until,
    write_atomically,
)

NODE_ID = "e2e-node"
CONCURRENCY = 32


def binomial_bounds(n: int, p: float, sigmas: float = 4.5) -> tuple[float, float]:
    """The range a Binomial(n, p) count falls in with overwhelming probability."""
    spread = sigmas * math.sqrt(n * p * (1.0 - p))
    return n * p - spread, n * p + spread


def render_policy(
    *,
    listener_port: int,
    backend_ports: dict[str, int],
    weights: dict[str, float | str],
) -> str:
    """The e2e policy: one listener, one service per version, one weighted route.

    ``weights`` is written verbatim into the YAML, so a test can write an invalid one and
    know its line: the backends list is the last thing in the file.
    """
    services = "".join(
        f'  - name: {name}\n    endpoints: ["127.0.0.1:{port}"]\n'
        for name, port in backend_ports.items()
    )
    backends = "".join(
        f"      - service: {name}\n        weight: {weight}\n" for name, weight in weights.items()
    )
    return (
        "version: 1\n"
        "listeners:\n"
        f"  - name: edge\n    port: {listener_port}\n"
        "services:\n"
        f"{services}"
        "routes:\n"
        "  - name: models\n"
        "    match: {path: {prefix: /}}\n"
        "    backends:\n"
        f"{backends}"
    )


# -- version backends ---------------------------------------------------------------------------


async def start_version_backend(version: str) -> tuple[web.AppRunner, int]:
    """An HTTP server answering every path with ``{"version": <version>}``."""
    body = f'{{"version": "{version}"}}'.encode()

    async def answer(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return await start_site(answer_every_path(answer))


@pytest.fixture
async def backend_ports() -> AsyncIterator[dict[str, int]]:
    runners: list[web.AppRunner] = []
    ports: dict[str, int] = {}
    try:
        for version in ("v1", "v2"):
            runner, port = await start_version_backend(version)
            runners.append(runner)
            ports[version] = port
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


# -- the control plane --------------------------------------------------------------------------


class ControlPlaneHarness:
    """The production control-plane wiring around one policy file, restartable in place."""

    def __init__(
        self,
        policy_path: Path,
        listener_port: int,
        *,
        translate: Callable[[IR], Resources] = translate,
    ) -> None:
        self.policy_path = policy_path
        self.listener_port = listener_port
        self.translate = translate
        self.port = 0
        self.gateway: RunningGateway | None = None

    async def start(self, *, port: int = 0) -> None:
        """The gateway for the file (control plane, policy watcher, ADS server on ``port``)."""
        self.gateway = await start_gateway(
            GatewayOptions(
                policy_path=self.policy_path,
                xds_port=port,
                admin_port=0,
                with_envoy=False,
                translate=self.translate,
            )
        )
        self.port = self.gateway.xds.port

    async def stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    @property
    def control_plane(self) -> ControlPlane:
        assert self.gateway is not None
        return self.gateway.control_plane

    @property
    def cache(self) -> SnapshotCache:
        return self.control_plane.cache

    @property
    def watcher(self) -> PolicyWatcher:
        assert self.gateway is not None
        return self.gateway.watcher

    @property
    def version(self) -> str:
        version = self.control_plane.version
        assert version is not None
        return version

    def acked(self, node_id: str = NODE_ID) -> dict[str, str]:
        for status in self.cache.node_status():
            if status.node_id == node_id:
                return dict(status.acked)
        return {}


@pytest.fixture
async def control_plane(
    tmp_path: Path, backend_ports: dict[str, int]
) -> AsyncIterator[ControlPlaneHarness]:
    path = tmp_path / "policy.yaml"
    listener_port = free_port()
    path.write_text(
        render_policy(
            listener_port=listener_port,
            backend_ports=backend_ports,
            weights={"v1": 90.0, "v2": 10.0},
        )
    )
    harness = ControlPlaneHarness(path, listener_port)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()


# -- the gateway: control plane + real Envoy + a client -----------------------------------------


class Gateway:
    """What a test drives: the policy file, the control plane, Envoy, and a keep-alive client."""

    def __init__(
        self,
        cp: ControlPlaneHarness,
        envoy: EnvoyProcess,
        listener_port: int,
        backend_ports: dict[str, int],
        session: aiohttp.ClientSession,
    ) -> None:
        self.cp = cp
        self.envoy = envoy
        self.listener_port = listener_port
        self.backend_ports = backend_ports
        self.session = session
        self.url = f"http://127.0.0.1:{listener_port}/v2/models/demo/infer"

    def policy_text(self, weights: dict[str, float | str]) -> str:
        return render_policy(
            listener_port=self.listener_port, backend_ports=self.backend_ports, weights=weights
        )

    async def request(self) -> tuple[int, str | None]:
        async with self.session.get(self.url) as response:
            if response.status != 200:
                await response.read()
                return response.status, None
            return 200, (await response.json())["version"]

    async def send(self, n: int, *, concurrency: int = CONCURRENCY) -> Counter[str]:
        """``n`` requests over ``concurrency`` keep-alive connections; counts by version, and
        by ``"status <code>"`` / ``"error"`` for anything that is not a 200."""
        counts: Counter[str] = Counter()
        remaining = iter(range(n))

        async def worker() -> None:
            for _ in remaining:
                try:
                    status, version = await self.request()
                except aiohttp.ClientError:
                    counts["error"] += 1
                    continue
                counts[version if version is not None else f"status {status}"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return counts

    async def envoy_route_version(self) -> str | None:
        dump = await self.envoy.config_dump("dynamic_route_configs")
        for config in dump.get("configs", []):
            if config.get("route_config", {}).get("name") == "edge":
                return config.get("version_info")
        return None

    async def edit(self, weights: dict[str, float | str], *, timeout: float = 10.0) -> str:
        """Write the policy file, wait until the control plane applied it and Envoy ACKed it;
        returns the new snapshot version."""
        before = self.cp.version
        write_atomically(self.cp.policy_path, self.policy_text(weights))
        await poll_until(
            lambda: self.cp.version != before, timeout=timeout, what="the edit to be applied"
        )
        version = self.cp.version
        acked = await self.cp.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=timeout)
        assert acked, f"Envoy did not ACK snapshot {version}: {self.cp.cache.node_status()}"
        return version


async def start_envoy(xds_port: int) -> EnvoyProcess:
    bootstrap = build_bootstrap(node_id=NODE_ID, xds_port=xds_port, admin_port=0)
    return await EnvoyProcess(bootstrap).start(wait="ready", timeout=20.0)


@pytest.fixture
async def gateway(
    control_plane: ControlPlaneHarness, backend_ports: dict[str, int]
) -> AsyncIterator[Gateway]:
    envoy = await start_envoy(control_plane.port)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY, force_close=False)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10))
    try:
        gw = Gateway(
            control_plane,
            envoy,
            control_plane.listener_port,
            backend_ports,
            session,
        )
        acked = await control_plane.cache.wait_for_acks(
            control_plane.version, node_ids=[NODE_ID], timeout=10
        )
        assert acked, "Envoy did not ACK the initial snapshot"
        await poll_until(_listening(gw), timeout=10, what="Envoy's listener to answer")
        yield gw
    finally:
        await session.close()
        envoy.stop()


def _listening(gw: Gateway) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            status, _ = await gw.request()
        except aiohttp.ClientError:
            return False
        return status == 200

    return check
