"""``inferway serve``: run the inference backend until SIGINT/SIGTERM.

A typer-style function (the gateway's CLI registers it with ``app.command("serve")``); it
prints where it listens and which models it loaded, then serves with uvloop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from pathlib import Path
from typing import Annotated

import typer

from inferway.backends.install_check import missing_backend_message, missing_backend_modules
from inferway.backends.jobs.settings import DEFAULT_MAX_JOBS, DEFAULT_TTL_S
from inferway.backends.jobs.store import JobStoreUnavailableError
from inferway.backends.process_tuning import tune_for_serving
from inferway.backends.serving.settings import (
    DEFAULT_BACKLOG,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HTTP_FRONTEND,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    HTTP_FRONTEND_ENV,
    ServingSettings,
)
from inferway.cli.serve_loop import echo_listeners, serve_until_signal
from inferway.cli.serve_options import (
    CannotListenError,
    backend_tls,
    job_settings,
)
from inferway.observability.log_format import (
    LogFormatChoice,
    install_log_handler,
    resolve_log_format,
)
from inferway.observability.masking import BUILTIN_PATTERNS, build_masker_from, pattern_error
from inferway.observability.redaction import install_redaction

__all__ = ["HttpFrontendChoice", "serve"]


class HttpFrontendChoice(enum.StrEnum):
    """The ``--http-frontend`` values (serving/settings.py's HTTP_FRONTENDS)."""

    fast = "fast"
    aiohttp = "aiohttp"


_DEFAULT_FRONTEND = HttpFrontendChoice(DEFAULT_HTTP_FRONTEND)


_EXIT_CANNOT_START = 2
"""docs/cli.md's exit code for a precondition not met here (the gateway's EXIT_CANNOT_START;
the backend does not import the gateway; tests/unit/test_install_check.py checks they agree)."""


def serve(
    repository_argument: Annotated[
        Path | None,
        typer.Argument(
            metavar="MODEL_REPOSITORY",
            help="Folder holding <model>/<version>/model.onnx (+ optional config.yaml).",
            show_default=False,
        ),
    ] = None,
    repository_option: Annotated[
        Path | None,
        typer.Option(
            "--model-repository",
            "-m",
            help="The same folder, given as an option (Triton's spelling).",
            show_default=False,
            envvar="INFERWAY_MODEL_REPOSITORY",
        ),
    ] = None,
    http_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="HTTP port (KServe v2 REST, /metrics); 0: any free port.",
            envvar="INFERWAY_HTTP_PORT",
        ),
    ] = 8000,
    grpc_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="gRPC port (inference.GRPCInferenceService); 0: any free port.",
            envvar="INFERWAY_GRPC_PORT",
        ),
    ] = 8001,
    host: Annotated[
        str, typer.Option(help="Address to bind.", envvar="INFERWAY_HOST")
    ] = "127.0.0.1",
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            help="OTLP/gRPC collector for traces, e.g. http://127.0.0.1:4317. Without one no "
            "spans are made (tracing costs nothing).",
            envvar="OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error.", envvar="INFERWAY_LOG_LEVEL")
    ] = "info",
    log_format: Annotated[
        LogFormatChoice | None,
        typer.Option(
            case_sensitive=False,
            help="json (one object per line) or text; default: json unless stderr is a terminal.",
            envvar="INFERWAY_LOG_FORMAT",
            show_default=False,
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve HTTP and gRPC over TLS with this PEM certificate.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key (chmod 600).")] = None,
    client_ca: Annotated[
        Path | None, typer.Option(help="PEM CA that client certificates must chain to.")
    ] = None,
    require_client_cert: Annotated[
        bool, typer.Option(help="Refuse clients without a certificate from --client-ca.")
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Worker processes sharing the ports (SO_REUSEPORT); each loads every model. "
            "One process serves at most one core of protocol work.",
            envvar="INFERWAY_WORKERS",
        ),
    ] = 1,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Largest request body on HTTP and gRPC alike (a model's max_input_bytes "
            "can only lower it).",
        ),
    ] = DEFAULT_MAX_BODY_BYTES,
    default_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Seconds a request may take when it names no deadline of its own (default: none).",
            show_default=False,
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Seconds from a request's first byte to the end of its headers; a slower "
            "client is cut off (408).",
        ),
    ] = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Seconds from the end of a request's headers to the end of its body.",
        ),
    ] = DEFAULT_BODY_TIMEOUT_S,
    idle_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="Seconds a keep-alive connection may idle between requests."),
    ] = DEFAULT_IDLE_TIMEOUT_S,
    backlog: Annotated[
        int,
        typer.Option(
            min=1,
            help="HTTP listen backlog: room for bursts of new connections, which then get "
            "429 from the queue limit instead of stalling in the kernel.",
        ),
    ] = DEFAULT_BACKLOG,
    record_outputs: Annotated[
        int,
        typer.Option(
            min=0,
            help="Keep digests of the last N answers by x-request-id at GET "
            "/v2/debug/outputs, for a rollout's output-agreement check (0: off).",
        ),
    ] = 0,
    mask: Annotated[
        list[str] | None,
        typer.Option(
            "--mask",
            help="Mask this in log lines, span errors and recorded text outputs: a built-in "
            "(email, phone, id_number) or an RE2 pattern; repeat for more.",
            show_default=False,
        ),
    ] = None,
    jobs_redis: Annotated[
        str | None,
        typer.Option(
            help="Keep asynchronous jobs in Redis Streams at this URL (redis://[:PASSWORD@]HOST"
            ":PORT/DB), so none is lost when the backend dies; default: in this process.",
            envvar="INFERWAY_JOBS_REDIS",
            show_default=False,
        ),
    ] = None,
    jobs_max: Annotated[
        int,
        typer.Option(
            min=0,
            help="Jobs held at once (queued, running, finished within --jobs-ttl); one more is "
            "refused with 429. 0: no asynchronous jobs (Prefer: respond-async is ignored).",
        ),
    ] = DEFAULT_MAX_JOBS,
    jobs_ttl: Annotated[
        float, typer.Option(min=1, help="Seconds a finished job and its result are kept.")
    ] = DEFAULT_TTL_S,
    jobs_concurrency: Annotated[
        int, typer.Option(min=1, help="Jobs this backend works at once.")
    ] = 4,
    jobs_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="Seconds a job may run when its request names no timeout."),
    ] = 3600.0,
    jobs_claim_idle: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="With --jobs-redis: seconds a job may sit unacknowledged, its backend silent, "
            "before another backend takes it over.",
        ),
    ] = 30.0,
    http_frontend: Annotated[
        HttpFrontendChoice,
        typer.Option(
            envvar=HTTP_FRONTEND_ENV,
            help="fast: infer requests are parsed and answered by httptools, every other "
            "request is handed to aiohttp (docs/backend.md); aiohttp: aiohttp serves all.",
        ),
    ] = _DEFAULT_FRONTEND,
) -> None:
    """Serve the models in MODEL_REPOSITORY over the Open Inference Protocol (HTTP + gRPC)."""
    missing = missing_backend_modules()
    if missing:  # the gateway-only install (docs/install.md): say which install brings them
        typer.echo(missing_backend_message("serve", missing), err=True)
        raise typer.Exit(_EXIT_CANNOT_START)
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    chosen_format = resolve_log_format(log_format)
    install_log_handler(level, chosen_format)
    rules = tuple(mask or ())
    for rule in rules:
        if rule not in BUILTIN_PATTERNS and (reason := pattern_error(rule)) is not None:
            raise typer.BadParameter(f"{rule!r}: {reason}", param_hint="--mask")
    install_redaction(masker=build_masker_from(rules))  # credentials never reach the log
    if repository_argument and repository_option and repository_argument != repository_option:
        raise typer.BadParameter(
            f"two different repositories given: {repository_argument} and {repository_option}",
            param_hint="MODEL_REPOSITORY / --model-repository",
        )
    model_repository = repository_argument or repository_option
    if model_repository is None:
        raise typer.BadParameter(
            "give the model repository folder, e.g. `inferway serve ./models`",
            param_hint="MODEL_REPOSITORY / --model-repository",
        )
    if not model_repository.is_dir():
        raise typer.BadParameter(
            f"{model_repository} is not a directory", param_hint="MODEL_REPOSITORY"
        )
    tls = backend_tls(tls_cert, tls_key, client_ca, require_client_cert)
    try:
        serving = ServingSettings(
            max_body_bytes=max_body_bytes,
            default_timeout_s=default_timeout,
            record_outputs=record_outputs,
            http_frontend=http_frontend.value,
            mask=rules,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            idle_timeout_s=idle_timeout,
        )
    except ValueError as exc:  # e.g. a timeout of inf
        raise typer.BadParameter(str(exc)) from None
    jobs = job_settings(
        jobs_redis, jobs_max, jobs_ttl, jobs_concurrency, jobs_timeout, jobs_claim_idle, workers
    )
    if record_outputs and workers > 1:
        raise typer.BadParameter(
            "each worker would keep its own table of answers and /v2/debug/outputs would "
            "show a random one; record outputs with --workers 1",
            param_hint="--record-outputs",
        )
    if workers > 1:
        if http_port == 0 or grpc_port == 0:
            raise typer.BadParameter(
                "workers share their ports: give fixed --http-port and --grpc-port",
                param_hint="--workers",
            )
        from inferway.backends.workers import WorkerSettings, run_workers

        settings = WorkerSettings(
            repository=model_repository,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            log_level=level,
            log_format=chosen_format,
            tls=tls,
            otlp_endpoint=otlp_endpoint,
            serving=serving,
            backlog=backlog,
        )
        from inferway.backends.batching.cpu_allowance import describe_allowance

        typer.echo(f"inferway backend serving {model_repository} with {workers} workers")
        echo_listeners(host, http_port, grpc_port, tls)
        typer.echo(f"  CPUs  {describe_allowance()} (the workers together)")
        raise typer.Exit(run_workers(settings, workers, typer.echo))
    tune_for_serving()
    where = (model_repository, http_port, grpc_port, host)
    provider = None
    if otlp_endpoint:  # spans nobody exports would cost ~50 us of CPU per request
        from inferway.observability.otel import setup_tracing

        provider = setup_tracing("inferway-backend", otlp_endpoint)
    try:
        try:
            import uvloop
        except ImportError:  # e.g. Windows: plain asyncio still works
            asyncio.run(
                serve_until_signal(*where, tls=tls, settings=serving, backlog=backlog, jobs=jobs)
            )
        else:
            uvloop.run(
                serve_until_signal(*where, tls=tls, settings=serving, backlog=backlog, jobs=jobs)
            )
    except JobStoreUnavailableError as exc:
        typer.echo(f"error: {exc} (--jobs-redis)", err=True)
        raise typer.Exit(_EXIT_CANNOT_START) from None
    except CannotListenError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(_EXIT_CANNOT_START) from None
    finally:
        if provider is not None:
            provider.shutdown()
