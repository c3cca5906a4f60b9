"""Start and stop a whole inference backend: model repository, HTTP and gRPC servers.

The servers come up first, so liveness answers and readiness says "not yet" while models load
and warm up; stopping drains in-flight requests before the models are unloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web
from opentelemetry.trace import TracerProvider

from inferway.backends.batching import BatchExecutor, BatchingConfig
from inferway.backends.batching.cpu_allowance import process_allowance
from inferway.backends.batching.shared_loop import SharedLoop
from inferway.backends.jobs.http_routes import add_job_routes
from inferway.backends.jobs.service import JobService
from inferway.backends.jobs.settings import JobSettings
from inferway.backends.models.repository import ModelRepository
from inferway.backends.pipelines.registry import PipelineSet
from inferway.backends.protocol.grpc_server import start_grpc_server
from inferway.backends.protocol.http_server import build_http_app
from inferway.backends.runners.base import Runner
from inferway.backends.serving.core import ServingCore
from inferway.backends.serving.settings import DEFAULT_BACKLOG, ServingSettings
from inferway.backends.telemetry.metrics import BackendMetrics
from inferway.backends.telemetry.pipeline_metrics import PipelineMetrics
from inferway.backends.tls import BackendTls, build_grpc_server_credentials, build_ssl_context

__all__ = [
    "BackendHandle",
    "build_repository",
    "describe_served",
    "serve_repository",
    "start_backend",
]

if TYPE_CHECKING:  # imported when chosen: httptools comes with the backend extra
    from inferway.backends.protocol.fast_http import FastHttpServer

log = logging.getLogger("inferway.backends")


@dataclass
class BackendHandle:
    """A running backend. ``stop()`` drains requests, then unloads the models."""

    host: str
    http_port: int
    grpc_port: int
    repository: ModelRepository
    metrics: BackendMetrics
    _runner: web.AppRunner = field(repr=False)
    _grpc: grpc.aio.Server = field(repr=False)
    _stopped: bool = field(default=False, repr=False)
    jobs: JobService | None = None
    """The asynchronous jobs (None: off)."""
    _fast: FastHttpServer | None = field(default=None, repr=False)

    async def _stop_http(self, grace: float) -> None:
        if self._fast is not None:  # first: it hands connections to the runner's server
            await self._fast.close(grace)
        await self._runner.cleanup()

    async def stop(self, grace: float = 5.0) -> None:
        """Refuse new work, let in-flight requests finish (up to ``grace`` seconds), stop the
        servers, then drain the executors and close the models. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        await asyncio.gather(self._grpc.stop(grace), self._stop_http(grace))
        if self.jobs is not None:  # jobs still running are left to the store (see jobs/)
            await self.jobs.stop()
        await self.repository.stop()


def describe_served(model: Any) -> str:
    """One line about a loaded model version, as ``inferway serve`` prints it."""
    return (
        f"{model.name} v{model.version}: {model.platform} on {model.provider}, "
        f"loaded in {model.load_seconds:.2f}s"
    )


def _executor_factory(metrics: BackendMetrics, tracer_provider: TracerProvider | None) -> Any:
    shared_loop = SharedLoop()  # the server's models share one event loop

    def build(runners: Sequence[Runner], config: BatchingConfig, name: str) -> BatchExecutor:
        return BatchExecutor(
            runners,
            config,
            name=name,
            on_batch=metrics.on_batch,
            tracer_provider=tracer_provider,
            measure_loop=True,  # the fill_when_busy rule: the server's loop is measured
            cpu_allowance=process_allowance(),  # compute_thread auto: one CPU, one thread
            shared_loop=shared_loop,
        )

    return build


def build_repository(
    root: str | Path,
    *,
    tracer_provider: TracerProvider | None = None,
    metrics_dir: str | None = None,
) -> tuple[ModelRepository, BackendMetrics]:
    """A ModelRepository whose executors report every batch to a fresh BackendMetrics (and
    their batch spans to ``tracer_provider``, the global one when None); its pipelines count
    cache and expert activity in the same registry and trace their steps there too."""
    holder: list[ModelRepository] = []
    metrics = BackendMetrics(
        models=lambda: holder[0].models() if holder else [],
        ready=lambda: bool(holder[0].ready) if holder else False,
        shared_dir=metrics_dir,
    )
    pipelines = PipelineSet(
        metrics=PipelineMetrics(metrics.registry), tracer_provider=tracer_provider
    )
    repository = ModelRepository(
        root, executor_factory=_executor_factory(metrics, tracer_provider), pipelines=pipelines
    )
    holder.append(repository)
    return repository, metrics


async def serve_repository(
    repository: ModelRepository,
    metrics: BackendMetrics,
    *,
    host: str = "127.0.0.1",
    http_port: int = 0,
    grpc_port: int = 0,
    settings: ServingSettings | None = None,
    grace: float = 5.0,
    tracer_provider: TracerProvider | None = None,
    tls: BackendTls | None = None,
    reuse_port: bool = False,
    backlog: int = DEFAULT_BACKLOG,
    jobs: JobSettings | None = None,
) -> BackendHandle:
    """Start the HTTP and gRPC servers over ``repository`` (started or not); with ``tls``
    both serve TLS and, when it says so, require client certificates. ``reuse_port`` lets
    several worker processes bind the same ports (SO_REUSEPORT: the kernel spreads the
    connections); without it a port already in use is an error, for gRPC too. ``settings``
    (body limit, default timeout) apply to both servers alike. ``jobs``: serve asynchronous
    jobs (docs/jobs.md) from the store it names."""
    core = ServingCore(repository, metrics, settings=settings, tracer_provider=tracer_provider)
    app = build_http_app(core)
    job_service = JobService(core, jobs) if jobs is not None else None
    if job_service is not None:
        add_job_routes(app, job_service)
    # handler_cancellation: a client that hangs up cancels its handler, so a request still
    # queued is dropped (never computed) and counted as cancelled.
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=grace,
        handler_cancellation=True,
        keepalive_timeout=core.settings.idle_timeout_s,
    )
    await runner.setup()
    fast: FastHttpServer | None = None
    try:
        if job_service is not None:  # before binding: an unreachable Redis refuses to start
            await job_service.start()
        ssl_context = build_ssl_context(tls) if tls is not None else None
        if core.settings.http_frontend == "fast":
            from inferway.backends.protocol.fast_http import FastHttpServer

            assert runner.server is not None  # set up above
            fast = FastHttpServer(core, runner.server)
            bound_http = await fast.start(
                host, http_port, ssl_context=ssl_context, backlog=backlog, reuse_port=reuse_port
            )
        else:
            site = web.TCPSite(
                runner,
                host,
                http_port,
                ssl_context=ssl_context,
                backlog=backlog,
                reuse_port=reuse_port or None,
            )
            await site.start()
            bound_http = _bound_port(runner, http_port)
        server, bound_grpc = await start_grpc_server(
            core,
            host=host,
            port=grpc_port,
            credentials=build_grpc_server_credentials(tls) if tls is not None else None,
            reuse_port=reuse_port,
        )
    except BaseException:
        if fast is not None:
            await fast.close(0)
        await runner.cleanup()
        if job_service is not None:
            await job_service.stop()
        raise
    return BackendHandle(
        host=host,
        http_port=bound_http,
        grpc_port=bound_grpc,
        repository=repository,
        metrics=metrics,
        _runner=runner,
        _grpc=server,
        jobs=job_service,
        _fast=fast,
    )


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


async def start_backend(
    repository_root: str | Path,
    *,
    host: str = "127.0.0.1",
    http_port: int = 0,
    grpc_port: int = 0,
    watch: bool = True,
    settings: ServingSettings | None = None,
    grace: float = 5.0,
    tracer_provider: TracerProvider | None = None,
    tls: BackendTls | None = None,
    reuse_port: bool = False,
    load_first: bool = False,
    metrics_dir: str | None = None,
    backlog: int = DEFAULT_BACKLOG,
    jobs: JobSettings | None = None,
) -> BackendHandle:
    """Serve every model under ``repository_root``; returns once all are loaded and warm
    (the servers already answer liveness, and readiness 503, while they load). Request and
    batch spans go to ``tracer_provider`` (the global one when None).

    A worker of ``inferway serve --workers N`` passes ``reuse_port``, ``load_first`` (bind
    only once warm, so the kernel never hands a connection to a worker still loading) and
    ``metrics_dir`` (prometheus_client's multiprocess files, shared by the workers)."""
    repository, metrics = build_repository(
        repository_root, tracer_provider=tracer_provider, metrics_dir=metrics_dir
    )
    if load_first:
        await repository.start(watch=watch)
    try:
        handle = await serve_repository(
            repository,
            metrics,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            settings=settings,
            grace=grace,
            tracer_provider=tracer_provider,
            tls=tls,
            reuse_port=reuse_port,
            backlog=backlog,
            jobs=jobs,
        )
    except BaseException:
        if load_first:
            await repository.stop()
        raise
    if load_first:
        return handle
    try:
        await repository.start(watch=watch)
    except BaseException:
        with contextlib.suppress(Exception):
            await handle.stop(grace=0)
        raise
    return handle
