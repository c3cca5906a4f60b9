"""Binding and starting the gateway's own gRPC servers (the feature router, the LLM processor,
the endpoint picker): one place that brackets IPv6 hosts, refuses a port it cannot bind with
a clear error, and logs where it listens."""

from __future__ import annotations

import logging

import grpc

__all__ = ["listen_and_start"]

log = logging.getLogger(__name__)


async def listen_and_start(server: grpc.aio.Server, host: str, port: int, what: str) -> int:
    """Bind ``server`` (its services already added) to ``host:port`` (0: the OS picks), start
    it and return the port bound. ``what`` names it in the error and the log line."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound: int = server.add_insecure_port(address)
    if not bound:
        raise OSError(f"{what}: cannot listen on {address}")
    await server.start()
    log.info("%s on %s:%d", what, host, bound)
    return bound
