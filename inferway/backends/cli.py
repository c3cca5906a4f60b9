"""``inferway serve``: run the inference backend until SIGINT/SIGTERM.

A typer-style function (the gateway's CLI registers it with ``app.command("serve")``); it
prints where it listens and which models it loaded, then serves with uvloop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from inferway.observability.redaction import install_redaction

__all__ = ["serve"]


async def _serve(
    model_repository: Path, http_port: int, grpc_port: int, host: str, echo: bool = True
) -> None:
    from inferway.backends.app import start_backend

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    handle = await start_backend(
        model_repository, host=host, http_port=http_port, grpc_port=grpc_port
    )
    try:
        typer.echo(f"inferway backend serving {model_repository}")
        typer.echo(f"  HTTP  http://{host}:{handle.http_port}  (KServe v2, /metrics)")
        typer.echo(f"  gRPC  {host}:{handle.grpc_port}  (inference.GRPCInferenceService)")
        models = handle.repository.models()
        if not models:
            typer.echo("  no models loaded yet (watching the repository for new ones)")
        for m in models:
            typer.echo(
                f"  model {m.name} v{m.version}: {m.platform} on {m.provider}, "
                f"loaded in {m.load_seconds:.2f}s"
            )
        for where, why in sorted(handle.repository.errors.items()):
            typer.echo(f"  refused {where}: {why}", err=True)
        await stop.wait()
        typer.echo("stopping: draining in-flight requests")
    finally:
        await handle.stop()


def serve(
    model_repository: Annotated[
        Path,
        typer.Argument(
            help="Folder holding <model>/<version>/model.onnx (+ optional config.yaml)."
        ),
    ],
    http_port: Annotated[int, typer.Option(help="HTTP port (KServe v2 REST, /metrics).")] = 8000,
    grpc_port: Annotated[
        int, typer.Option(help="gRPC port (inference.GRPCInferenceService).")
    ] = 8001,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(help="OTLP/gRPC collector for traces, e.g. http://127.0.0.1:4317."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the models in MODEL_REPOSITORY over the Open Inference Protocol (HTTP + gRPC)."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_redaction()  # credentials never reach the log
    if not model_repository.is_dir():
        raise typer.BadParameter(
            f"{model_repository} is not a directory", param_hint="MODEL_REPOSITORY"
        )
    from inferway.observability.otel import setup_tracing

    provider = setup_tracing("inferway-backend", otlp_endpoint)
    try:
        try:
            import uvloop
        except ImportError:  # e.g. Windows: plain asyncio still works
            asyncio.run(_serve(model_repository, http_port, grpc_port, host))
        else:
            uvloop.run(_serve(model_repository, http_port, grpc_port, host))
    finally:
        provider.shutdown()
