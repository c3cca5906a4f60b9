"""Real Envoy + the real control plane + controllable aiohttp backends, for the traffic
integration tests and the failover benchmark.

    async with TrafficGateway(policy_text) as gw:     # {listener_port}, {<backend>} filled in
        results = await gw.load(duration=1.0)           # paced load, one Result per request

A :class:`ControlledBackend` answers ``{"backend": <name>}``, with a configurable delay and
status, a readiness path that can be made to fail, optional ORCA load reports, and can be
killed (its server closed, connections dropped) and revived on the same port. Every wait
polls with a deadline; everything started is stopped.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web

from inferway.backends.telemetry.orca import ORCA_HEADER, LoadReport, build_orca_header
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.envoy_modules import provide_envoy_modules
from inferway.gateway.runtime import Gateway, GatewayOptions, start_gateway
from inferway.resolve import IR
from inferway.xds.bootstrap import build_bootstrap
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import Resources
from tests.aiohttp_sites import start_site
from tests.envoy_process import EnvoyProcess, free_port
from tests.helpers import poll_until  # re-exported for the tests importing them here

__all__ = [
    "ControlledBackend",
    "FailoverTiming",
    "HostStatus",
    "Result",
    "TrafficGateway",
    "poll_until",
    "share",
    "watch_failover",
]

NODE_ID = "traffic-node"


class ControlledBackend:
    """One replica whose behaviour a test changes while traffic flows."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.delay = 0.0
        self.status = 200
        self.ready = True
        self.utilization: float | None = None
        """When set, every answer carries an ORCA report with this utilization."""
        self.report_rps = 100.0
        self.headers: dict[str, str] = {}
        """Sent with every non-health answer."""
        self.hits: list[float] = []
        """monotonic() of every non-health request served."""
        self.seen: list[dict[str, str]] = []
        """The headers (lower-cased names) of every non-health request served."""
        self.active = 0
        self.metrics_text: str | None = None
        """Served at ``GET /metrics`` (Prometheus text); None: 404. Never counted as a hit."""
        self._runner: web.AppRunner | None = None

    async def start(self) -> ControlledBackend:
        app = web.Application()
        app.router.add_get("/v2/health/ready", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner, self.port = await start_site(
            app, port=self.port, reuse_address=True, shutdown_timeout=0.05
        )
        return self

    async def kill(self) -> None:
        """Close the listening socket and every connection, as a crashed replica would."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def revive(self) -> None:
        """Listen again on the same port."""
        if self._runner is None:
            await self.start()

    @property
    def alive(self) -> bool:
        return self._runner is not None

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503, text="ready" if self.ready else "")

    async def _metrics(self, _request: web.Request) -> web.Response:
        if self.metrics_text is None:
            return web.Response(status=404)
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _answer(self, request: web.Request) -> web.Response:
        self.hits.append(time.monotonic())
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        self.active += 1
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        headers = dict(self.headers)
        if self.utilization is not None:
            report = LoadReport(rps=self.report_rps, utilization=self.utilization, queue_depth=0)
            headers[ORCA_HEADER] = build_orca_header(report)
        body = f'{{"backend": "{self.name}"}}'
        return web.Response(
            status=self.status, text=body, content_type="application/json", headers=headers
        )


@dataclass(frozen=True)
class Result:
    status: int  # 0: the client saw a connection error
    backend: str | None
    at: float
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


@dataclass(frozen=True)
class HostStatus:
    """One upstream host as Envoy's admin /clusters reports it."""

    port: int
    requests: int  # rq_total + cx_connect_fail: every time Envoy routed to it
    ejected: bool  # failed outlier detection
    failed_health_check: bool


@dataclass(frozen=True)
class FailoverTiming:
    killed_at: float  # monotonic()
    last_routed_s: float
    """From the kill to the last change of the dead host's rq_total + cx_connect_fail."""
    out_of_rotation_s: float | None
    """From the kill until Envoy first marked it ejected or unhealthy (None: never)."""
    first_poll_s: float
    """From the kill to the first poll's answer: the resolution of the two figures above
    (the kill itself, closing the server and its connections, is inside it)."""


async def watch_failover(
    gw: TrafficGateway,
    cluster: str,
    backend: ControlledBackend,
    *,
    watch_for: float,
    interval: float = 0.02,
) -> FailoverTiming:
    """Kill ``backend`` and poll Envoy's per-host counters of it for ``watch_for`` seconds.
    The counters are read once before the kill, so routing right after it counts too."""
    port = backend.port
    before = (await gw.hosts(cluster)).get(port)
    last_count = before.requests if before is not None else None
    killed_at = time.monotonic()
    await backend.kill()
    last_change = killed_at
    out_at: float | None = None
    first_poll: float | None = None
    while time.monotonic() < killed_at + watch_for:
        host = (await gw.hosts(cluster)).get(port)
        now = time.monotonic()
        first_poll = first_poll or now
        if host is not None:
            if last_count is not None and host.requests != last_count:
                last_change = now
            last_count = host.requests
            if out_at is None and (host.ejected or host.failed_health_check):
                out_at = now
        await asyncio.sleep(interval)
    return FailoverTiming(
        killed_at,
        last_change - killed_at,
        None if out_at is None else out_at - killed_at,
        (first_poll or killed_at) - killed_at,
    )


def share(results: Iterable[Result]) -> Counter[str]:
    """Counts by backend name (and ``status <n>`` for non-200 answers)."""
    counts: Counter[str] = Counter()
    for r in results:
        counts[r.backend if r.status == 200 and r.backend else f"status {r.status}"] += 1
    return counts


class TrafficGateway:
    """The gateway as the composition root builds it (``start_gateway`` as ``inferway run
    --no-envoy``, from a policy file in a temp dir) and one Envoy, for a policy given as text;
    ``{listener_port}`` and ``{<backend name>}`` placeholders are filled in with the listener's
    and the backends' ports. An edit is written to the file and applied as the watcher does."""

    def __init__(
        self,
        policy_template: str,
        backends: Iterable[ControlledBackend],
        *,
        translate: Callable[[IR], Resources] | None = None,
        envoy_concurrency: int | None = None,
        envoy_modules: bool = True,
    ) -> None:
        """``translate``: what the gateway pushes with (None: the real translator), for a
        test that changes one thing of what Envoy gets; ``envoy_concurrency``: Envoy's worker
        threads (None: one per core); ``envoy_modules``: Envoy gets inferway's modules (the
        native SSE reader) as ``inferway run`` gives them, when they build here."""
        self._envoy_modules = envoy_modules
        self.template = policy_template
        self._translate = translate
        self._envoy_args = (
            [] if envoy_concurrency is None else ["--concurrency", str(envoy_concurrency)]
        )
        self.backends = {b.name: b for b in backends}
        self.listener_port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="inferway-traffic-")
        self.policy_path = Path(self._dir.name) / "policy.yaml"
        self.gateway: Gateway | None = None
        self.envoy: EnvoyProcess | None = None
        self.session: aiohttp.ClientSession | None = None
        self._admin: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener_port}"

    def render(self, template: str | None = None) -> str:
        ports = {name: b.port for name, b in self.backends.items()}
        return (template or self.template).format(listener_port=self.listener_port, **ports)

    async def start(self, *, wait_for: Iterable[str] = ()) -> TrafficGateway:
        """Start everything; then wait until each backend in ``wait_for`` got a request."""
        for backend in self.backends.values():
            if not backend.port:
                await backend.start()
        try:
            self.policy_path.write_text(self.render(), encoding="utf-8")
            self.gateway = await start_gateway(
                GatewayOptions(
                    policy_path=self.policy_path,
                    xds_port=0,
                    admin_port=0,
                    with_envoy=False,
                    translate=self._translate,
                )
            )
            bootstrap = build_bootstrap(
                node_id=NODE_ID, xds_port=self.gateway.xds.port, admin_port=0
            )
            env = provide_envoy_modules(bootstrap) if self._envoy_modules else {}
            self.envoy = await EnvoyProcess(bootstrap, extra_args=self._envoy_args, env=env).start(
                wait="ready", timeout=20.0
            )
            connector = aiohttp.TCPConnector(limit=64)
            self.session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=10)
            )
            await self.wait_acked()
            for name in wait_for:
                backend = self.backends[name]
                before = len(backend.hits)
                await poll_until(
                    self._reaches(backend, before), timeout=15, what=f"traffic to {name}"
                )
        except BaseException:
            await self.stop()
            raise
        return self

    def _reaches(self, backend: ControlledBackend, before: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            await self.get("/warmup")
            return len(backend.hits) > before

        return check

    async def wait_acked(self) -> None:
        version = self.control_plane.version
        assert version is not None
        acked = await self.cache.wait_for_acks(version, node_ids=[NODE_ID], timeout=15)
        assert acked, f"Envoy did not ACK {version}: {self.cache.node_status()}"

    @property
    def control_plane(self) -> ControlPlane:
        assert self.gateway is not None
        return self.gateway.control_plane

    @property
    def cache(self) -> SnapshotCache:
        return self.control_plane.cache

    async def apply(self, template: str) -> None:
        assert self.gateway is not None
        self.policy_path.write_text(self.render(template), encoding="utf-8")
        result = self.gateway.watcher.reload()  # None: the watcher had applied it already
        assert result is None or result.refusal is None, result.refusal
        await self.wait_acked()

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.aclose()
            self._admin = None
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None
        for backend in self.backends.values():
            await backend.kill()
        self._dir.cleanup()

    async def __aenter__(self) -> TrafficGateway:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- client ----------------------------------------------------------------------------

    async def get(self, path: str = "/", headers: dict[str, str] | None = None) -> Result:
        assert self.session is not None
        try:
            async with self.session.get(self.url + path, headers=headers) as response:
                body = await response.text()
                backend = None
                if response.status == 200:
                    backend = (await response.json(content_type=None)).get("backend")
                return Result(
                    response.status,
                    backend,
                    time.monotonic(),
                    {k.lower(): v for k, v in response.headers.items()},
                    body,
                )
        except aiohttp.ClientError:
            return Result(0, None, time.monotonic())

    async def send(self, n: int, *, concurrency: int = 16, path: str = "/") -> list[Result]:
        """``n`` requests as fast as ``concurrency`` connections allow."""
        results: list[Result] = []
        remaining = iter(range(n))

        async def worker() -> None:
            for _ in remaining:
                results.append(await self.get(path))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results

    async def load(
        self,
        *,
        duration: float,
        rate: float = 200.0,
        concurrency: int = 16,
        path: str = "/",
        during: Callable[[], Awaitable[Any]] | None = None,
    ) -> list[Result]:
        """Paced open-ish load: ``rate`` requests per second spread over ``concurrency``
        workers for ``duration`` seconds; ``during`` runs concurrently (e.g. a kill)."""
        results: list[Result] = []
        interval = concurrency / rate
        deadline = time.monotonic() + duration

        async def worker(offset: float) -> None:
            next_at = time.monotonic() + offset
            while next_at < deadline:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                results.append(await self.get(path))
                next_at += interval

        tasks = [worker(i * interval / concurrency) for i in range(concurrency)]
        if during is not None:
            tasks.append(during())  # type: ignore[arg-type]
        await asyncio.gather(*tasks)
        return results

    # -- Envoy's view ----------------------------------------------------------------------

    async def hosts(self, cluster: str) -> dict[int, HostStatus]:
        """Per-host counters and health flags of ``cluster``, by port."""
        assert self.envoy is not None
        if self._admin is None:  # one keep-alive client: polls stay a few ms apart
            self._admin = httpx.AsyncClient(base_url=self.envoy.admin_url, timeout=5.0)
        response = await self._admin.get("/clusters", params={"format": "json"})
        response.raise_for_status()
        out: dict[int, HostStatus] = {}
        for status in response.json().get("cluster_statuses", []):
            if status.get("name") != cluster:
                continue
            for host in status.get("host_statuses", []):
                port = int(host["address"]["socket_address"]["port_value"])
                stats = {s["name"]: int(s.get("value", 0)) for s in host.get("stats", [])}
                health = host.get("health_status", {})
                out[port] = HostStatus(
                    port=port,
                    requests=stats.get("rq_total", 0) + stats.get("cx_connect_fail", 0),
                    ejected=bool(health.get("failed_outlier_check")),
                    failed_health_check=bool(health.get("failed_active_health_check")),
                )
        return out

    async def stats(self, filter_regex: str) -> dict[str, int]:
        assert self.envoy is not None
        return await self.envoy.get_stats(filter_regex)
