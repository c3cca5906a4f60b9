"""``inferway serve``'s option groups turned into the settings objects they configure
(asynchronous jobs, TLS), each refusing a combination that cannot work as a usage error
naming the option."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import typer

from inferway.backends.jobs.settings import JobSettings
from inferway.backends.tls import BackendTls

__all__ = [
    "CannotListenError",
    "backend_tls",
    "exposure_warning",
    "job_settings",
    "listen_error",
]


class CannotListenError(Exception):
    """The backend could not bind its ports: a usage error (exit 2) with the reason, not a
    traceback."""


def listen_error(host: str, http_port: int, grpc_port: int, exc: OSError) -> str:
    """What to tell the user when binding failed: the address, the ports, the system's reason
    and the option to change."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {host!r}: {reason} (--host)"
    return (
        f"cannot listen on {host} (HTTP port {http_port}, gRPC port {grpc_port}): {reason} "
        "(--http-port / --grpc-port / --host; is another server using the port?)"
    )


def exposure_warning(host: str, tls: BackendTls | None) -> str | None:
    """The warning for a backend bound off loopback without client certificates: it has no
    other authentication, so whoever reaches the address can infer and load or unload models
    (``inferway run`` warns the same way for its admin API). None on loopback."""
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback or (tls is not None and tls.require_client_cert):
        return None
    return (
        f"warning: serving on {host}, not loopback, without client certificates: anyone who "
        "reaches it can run inference and load or unload models (/v2/repository); keep it "
        "on a private network behind the gateway, or require client certificates "
        "(--client-ca with --require-client-cert)"
    )


def job_settings(
    redis_url: str | None,
    max_jobs: int,
    ttl_s: float,
    concurrency: int,
    timeout_s: float,
    claim_idle_s: float,
    workers: int,
) -> JobSettings | None:
    """The jobs' settings (None: off). With --workers each process would keep its own jobs
    and answer polls for a random one's, so jobs are off there (Redis too, for now)."""
    if workers > 1:
        if redis_url:
            raise typer.BadParameter(
                "asynchronous jobs are served with --workers 1 only", param_hint="--jobs-redis"
            )
        return None
    if max_jobs == 0:
        return None
    try:
        return JobSettings(
            max_jobs=max_jobs,
            ttl_s=ttl_s,
            concurrency=concurrency,
            timeout_s=timeout_s,
            redis_url=redis_url or None,
            claim_idle_s=claim_idle_s,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--jobs-*") from None


def backend_tls(
    cert: Path | None, key: Path | None, client_ca: Path | None, require: bool
) -> BackendTls | None:
    if cert is None and key is None:
        if client_ca is not None or require:
            raise typer.BadParameter("client certificates need TLS: give --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise typer.BadParameter("TLS needs both --tls-cert and --tls-key")
    if require and client_ca is None:
        raise typer.BadParameter("--require-client-cert needs --client-ca")
    return BackendTls(cert, key, client_ca, require)
