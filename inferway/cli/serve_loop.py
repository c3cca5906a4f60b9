"""``inferway serve`` in the foreground, one process: the backend started, its listeners and
models printed, served until SIGINT or SIGTERM, then drained (serve.py reads the options)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer

from inferway.backends.jobs.settings import JobSettings
from inferway.backends.process_tuning import freeze_startup_heap
from inferway.backends.serving.settings import DEFAULT_BACKLOG, ServingSettings
from inferway.backends.tls import BackendTls
from inferway.cli.serve_options import CannotListenError, exposure_warning, listen_error

__all__ = ["echo_listeners", "serve_until_signal"]


async def serve_until_signal(
    model_repository: Path,
    http_port: int,
    grpc_port: int,
    host: str,
    echo: bool = True,
    tls: BackendTls | None = None,
    settings: ServingSettings | None = None,
    backlog: int = DEFAULT_BACKLOG,
    jobs: JobSettings | None = None,
) -> None:
    """Start the backend, print where it listens and what it serves, and serve until SIGINT
    or SIGTERM; then drain. CannotListenError when a port cannot be bound."""
    from inferway.backends.app import describe_served, start_backend
    from inferway.backends.batching.cpu_allowance import describe_allowance

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        handle = await start_backend(
            model_repository,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            tls=tls,
            settings=settings,
            backlog=backlog,
            jobs=jobs,
        )
    except OSError as exc:  # a port in use, an address not here, a name that does not resolve
        raise CannotListenError(listen_error(host, http_port, grpc_port, exc)) from None
    freeze_startup_heap()
    try:
        typer.echo(f"inferway backend serving {model_repository}")
        echo_listeners(host, handle.http_port, handle.grpc_port, tls)
        typer.echo(f"  CPUs  {describe_allowance()}")
        if handle.jobs is not None:
            typer.echo(f"  jobs  Prefer: respond-async -> /v2/jobs/ID, kept {handle.jobs.where}")
        models = handle.repository.models()
        if not models:
            typer.echo("  no models loaded yet (watching the repository for new ones)")
        for m in models:
            typer.echo(f"  model {describe_served(m)}")
        for where, why in sorted(handle.repository.errors.items()):
            typer.echo(f"  refused {where}: {why}", err=True)
        await stop.wait()
        typer.echo("stopping: draining in-flight requests")
    finally:
        await handle.stop()


def echo_listeners(host: str, http_port: int, grpc_port: int, tls: BackendTls | None) -> None:
    scheme = "https" if tls else "http"
    typer.echo(f"  HTTP  {scheme}://{host}:{http_port}  (KServe v2, /metrics)")
    if tls is not None:
        typer.echo(
            f"  TLS   {tls.certificate}; client certificates "
            + ("required" if tls.require_client_cert else "not required")
        )
    typer.echo(f"  gRPC  {host}:{grpc_port}  (inference.GRPCInferenceService)")
    if (warning := exposure_warning(host, tls)) is not None:
        typer.echo(warning, err=True)
