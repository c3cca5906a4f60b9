"""A control plane fed by an endpoints file, a real Envoy (SotW or delta ADS), and loopback
backends that say who they are, for the delta-xDS and endpoints-file integration tests.

    harness = await EndpointsHarness.start(tmp_path, mode="delta", backends=3)
    await harness.write_endpoints({"alpha": [0, 1], "beta": [2]})   # backend indexes
    counts = await harness.send("alpha", 100)                       # {port: n, ...}

The control plane is the production wiring, built by the composition root (``start_gateway``
as ``inferway run --no-envoy``), with an XdsStats hook on its cache counting what was sent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Literal

import aiohttp
from aiohttp import web

from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.endpoints_watcher import EndpointsWatcher
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.server import XdsServer
from inferway.xds.stats import XdsStats
from tests.aiohttp_sites import answer_every_path, start_site
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import (  # re-exported for the tests importing them here
    poll_until,
    write_atomically,
)

NODE_ID = "endpoints-envoy"
SERVICES = ("alpha", "beta")


class Backend:
    """Answers ``{"port": <its port>}``; ``/slow?ms=N`` first sleeps N ms (counts in-flight)."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.slow_in_flight = 0
        self.slow_done = 0

    async def start(self) -> None:
        async def answer(request: web.Request) -> web.Response:
            if request.path.startswith("/alpha/slow") or request.path.startswith("/beta/slow"):
                self.slow_in_flight += 1
                try:
                    await asyncio.sleep(int(request.query.get("ms", "1000")) / 1000)
                finally:
                    self.slow_in_flight -= 1
                    self.slow_done += 1
            return web.json_response({"port": self.port})

        self.runner, self.port = await start_site(answer_every_path(answer))

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def render_policy(listener_port: int) -> str:
    services = "".join(f"  - name: {name}\n" for name in SERVICES)
    routes = "".join(
        f"  - name: r-{name}\n    match: {{path: {{prefix: /{name}}}}}\n"
        f"    backends: [{{service: {name}}}]\n"
        for name in SERVICES
    )
    return (
        "version: 1\nendpoints_file: endpoints.yaml\n"
        f"listeners:\n  - {{name: edge, port: {listener_port}}}\n"
        f"services:\n{services}routes:\n{routes}"
    )


class EndpointsHarness:
    def __init__(self, directory: Path, mode: Literal["sotw", "delta"]) -> None:
        self.directory = directory
        self.mode = mode
        self.backends: list[Backend] = []
        self.listener_port = free_port()
        self.policy_path = directory / "policy.yaml"
        self.endpoints_path = directory / "endpoints.yaml"
        self.stats = XdsStats()
        self.gateway: Gateway | None = None
        self.server: XdsServer | None = None
        """The gateway's ADS server; a test may stop it and start another on the same cache."""
        self.envoy: EnvoyProcess | None = None
        self.session: aiohttp.ClientSession | None = None

    @classmethod
    async def start(
        cls,
        directory: Path,
        *,
        mode: Literal["sotw", "delta"],
        backends: int = 3,
        endpoints: dict[str, list[int]] | None = None,
    ) -> EndpointsHarness:
        harness = cls(directory, mode)
        try:
            await harness._start(backends, endpoints or {"alpha": [0, 1], "beta": [2]})
        except BaseException:
            await harness.stop()
            raise
        return harness

    async def _start(self, backends: int, endpoints: dict[str, list[int]]) -> None:
        for _ in range(backends):
            backend = Backend()
            await backend.start()
            self.backends.append(backend)
        self.policy_path.write_text(render_policy(self.listener_port))
        text = self.endpoints_text(endpoints)
        self.endpoints_path.write_text(text)
        self.gateway = await start_gateway(
            GatewayOptions(policy_path=self.policy_path, xds_port=0, admin_port=0, with_envoy=False)
        )
        self.cache.add_hook(self.stats)  # before Envoy connects: it sees every push
        self.server = self.gateway.xds
        bootstrap = build_bootstrap(
            node_id=NODE_ID, xds_port=self.gateway.xds.port, admin_port=0, ads=self.mode
        )
        self.envoy = await EnvoyProcess(bootstrap).start(wait="ready", timeout=20.0)
        connector = aiohttp.TCPConnector(limit=64)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=10)
        )
        assert await self.cache.wait_for_acks(self.version, node_ids=[NODE_ID], timeout=10)
        await poll_until(self._answers, timeout=10, what="Envoy's listener to answer")

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.envoy is not None:
            self.envoy.stop()
        if self.gateway is not None:
            if self.server is not None and self.server is not self.gateway.xds:
                await self.server.stop(grace=0.2)  # a test's replacement ADS server
            await self.gateway.stop()  # stopping its own ADS server again is harmless
        for backend in self.backends:
            await backend.stop()

    # -- driving it -------------------------------------------------------------------------

    @property
    def control_plane(self) -> ControlPlane:
        assert self.gateway is not None
        return self.gateway.control_plane

    @property
    def cache(self) -> SnapshotCache:
        return self.control_plane.cache

    @property
    def watcher(self) -> EndpointsWatcher:
        assert self.gateway is not None and self.gateway.endpoints_watcher is not None
        return self.gateway.endpoints_watcher

    @property
    def version(self) -> str:
        version = self.control_plane.version
        assert version is not None
        return version

    def port(self, index: int) -> int:
        return self.backends[index].port

    def endpoints_text(self, endpoints: dict[str, list[int]]) -> str:
        lines = ["services:"]
        for name, indexes in endpoints.items():
            addresses = ", ".join(f"127.0.0.1:{self.port(i)}" for i in indexes)
            lines.append(f"  {name}: [{addresses}]")
        return "\n".join(lines) + "\n"

    async def write_endpoints(
        self, endpoints: dict[str, list[int]], *, timeout: float = 10.0
    ) -> str:
        """Rewrite the endpoints file; wait until applied and ACKed by Envoy; the version."""
        before = self.version
        write_atomically(self.endpoints_path, self.endpoints_text(endpoints))
        await poll_until(
            lambda: self.version != before, timeout=timeout, what="the endpoints to be applied"
        )
        version = self.version
        acked = await self.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=timeout)
        assert acked, f"Envoy did not ACK {version}: {self.cache.node_status()}"
        return version

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.listener_port}{path}"

    async def request(self, path: str) -> tuple[int, int | None]:
        assert self.session is not None
        async with self.session.get(self.url(path)) as response:
            if response.status != 200:
                await response.read()
                return response.status, None
            return 200, int((await response.json())["port"])

    async def send(self, service: str, n: int, *, concurrency: int = 8) -> Counter[int | str]:
        """``n`` requests to ``/<service>``; counts by backend port, or "status N"/"error"."""
        counts: Counter[int | str] = Counter()
        remaining = iter(range(n))

        async def worker() -> None:
            for _ in remaining:
                try:
                    status, port = await self.request(f"/{service}")
                except aiohttp.ClientError as error:
                    counts[f"error {type(error).__name__}"] += 1
                    continue
                counts[port if port is not None else f"status {status}"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return counts

    async def _answers(self) -> bool:
        try:
            status, _ = await self.request("/alpha")
        except aiohttp.ClientError:
            return False
        return status == 200
