"""The ADS gRPC server: a thin shell that hands each stream to ``serve_sotw_stream`` or, for
the incremental protocol, ``serve_delta_stream``.

grpc.aio runs every RPC as its own task, so a slow Envoy only slows its own stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from inferway._xds_protos.envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from inferway.xds.auth import (
    NodeIdentityError,
    PeerRefusals,
    XdsTls,
    build_server_credentials,
    verified_requests,
)
from inferway.xds.config_watcher import ConfigWatcher
from inferway.xds.node_address import with_peer
from inferway.xds.stream import XdsProtocolError, serve_delta_stream, serve_sotw_stream

__all__ = ["XdsServer", "start_xds_server"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_CONNECTION_AGE_S = 30 * 60.0
"""Envoys reconnect this often (gRPC GOAWAY, then the open stream ends after a grace of one
tenth of it): a rotated certificate or CA takes effect everywhere within this, and a fleet
spreads again over control-plane replicas. Envoy keeps its config across the reconnect."""


class _AggregatedDiscoveryService(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(
        self, cache: ConfigWatcher, tls: XdsTls | None = None, refusals: PeerRefusals | None = None
    ) -> None:
        self._cache = cache
        self._tls = tls
        self._refusals = refusals or PeerRefusals()

    def _verified(self, requests: object, context: grpc.aio.ServicerContext) -> object:
        """With mutual TLS, the stream's node must be the client certificate's identity; the
        stream's peer address is recorded on its node (``xds/node_address.py``)."""
        if self._tls is not None:
            requests = verified_requests(requests, context, self._refusals)  # type: ignore[arg-type]
        return with_peer(requests, context.peer())  # type: ignore[arg-type]

    async def StreamAggregatedResources(
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        async def send(response: discovery_pb2.DiscoveryResponse) -> None:
            await context.write(response)

        requests = self._verified(request_iterator, context)
        try:
            await serve_sotw_stream(requests, send, self._cache)  # type: ignore[arg-type]
        except XdsProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except NodeIdentityError as error:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))

    async def DeltaAggregatedResources(
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        async def send(response: discovery_pb2.DeltaDiscoveryResponse) -> None:
            await context.write(response)

        requests = self._verified(request_iterator, context)
        try:
            await serve_delta_stream(requests, send, self._cache)  # type: ignore[arg-type]
        except XdsProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except NodeIdentityError as error:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))


@dataclass
class XdsServer:
    """A running ADS server bound to ``host:port``."""

    host: str
    port: int
    _server: grpc.aio.Server
    refusals: PeerRefusals = field(default_factory=PeerRefusals)
    """Streams refused because the node was not the client certificate's identity."""

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting streams and end the open ones after ``grace`` seconds; the Envoys keep
        serving their last config and reconnect when a server is back."""
        await self._server.stop(grace)


async def start_xds_server(
    cache: ConfigWatcher,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    tls: XdsTls | None = None,
    tls_reload: Callable[[], XdsTls | None] | None = None,
    max_connection_age_s: float | None = DEFAULT_MAX_CONNECTION_AGE_S,
    services: Sequence[Callable[[grpc.aio.Server], None]] = (),
    refusals: PeerRefusals | None = None,
) -> XdsServer:
    """Serve ADS (state-of-the-world and delta) for ``cache`` on ``host:port`` (0: any port).

    gRPC's 4 MiB default message limit is raised to ``max_message_bytes`` both ways: a large
    fleet's responses and Envoy's requests (long resource name lists) outgrow it.

    With ``tls``, Envoys must connect with a client certificate the CA signed, and a stream's
    ``node.id`` must be that certificate's identity (see ``inferway.xds.auth``).
    ``tls_reload`` is asked for rotated credentials before each new connection's handshake;
    ``max_connection_age_s`` (None: never) makes every Envoy reconnect that often, so the
    rotation reaches connections that were open before it. ``services`` add other gRPC
    services Envoy calls on the same connection's cluster (the stats it pushes).
    ``refusals``: where refused streams are recorded (shared with those services).
    """
    refusals = refusals if refusals is not None else PeerRefusals()
    options: list[tuple[str, int]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ]
    if max_connection_age_s is not None:
        age_ms = max(1, round(max_connection_age_s * 1000))
        options += [
            ("grpc.max_connection_age_ms", age_ms),
            ("grpc.max_connection_age_grace_ms", max(1, age_ms // 10)),
        ]
    server = grpc.aio.server(options=options)
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        _AggregatedDiscoveryService(cache, tls, refusals), server
    )
    for add_service in services:
        add_service(server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, build_server_credentials(tls, tls_reload))
    except RuntimeError as error:
        raise OSError(f"xDS server cannot listen on {address}: {error}") from error
    if bound == 0:
        raise OSError(f"xDS server cannot listen on {address} (port in use?)")
    await server.start()
    _log.info("xDS (ADS) server listening on %s:%d%s", host, bound, " (mutual TLS)" if tls else "")
    return XdsServer(host, bound, server, refusals)
