"""The ADS gRPC server: a thin shell that hands each stream to ``serve_sotw_stream`` or, for
the incremental protocol, ``serve_delta_stream``.

grpc.aio runs every RPC as its own task, so a slow Envoy only slows its own stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from inferway.xds.cache import SnapshotCache
from inferway.xds.stream import XdsProtocolError, serve_delta_stream, serve_sotw_stream

__all__ = ["XdsServer", "start_xds_server"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class _AggregatedDiscoveryService(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, cache: SnapshotCache) -> None:
        self._cache = cache

    async def StreamAggregatedResources(
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        async def send(response: discovery_pb2.DiscoveryResponse) -> None:
            await context.write(response)

        try:
            await serve_sotw_stream(request_iterator, send, self._cache)  # type: ignore[arg-type]
        except XdsProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def DeltaAggregatedResources(
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        async def send(response: discovery_pb2.DeltaDiscoveryResponse) -> None:
            await context.write(response)

        try:
            await serve_delta_stream(request_iterator, send, self._cache)  # type: ignore[arg-type]
        except XdsProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


@dataclass
class XdsServer:
    """A running ADS server bound to ``host:port``."""

    host: str
    port: int
    _server: grpc.aio.Server

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting streams and end the open ones after ``grace`` seconds; the Envoys keep
        serving their last config and reconnect when a server is back."""
        await self._server.stop(grace)


async def start_xds_server(
    cache: SnapshotCache,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> XdsServer:
    """Serve ADS (state-of-the-world and delta) for ``cache`` on ``host:port`` (0: any port).

    gRPC's 4 MiB default message limit is raised to ``max_message_bytes`` both ways: a large
    fleet's responses and Envoy's requests (long resource name lists) outgrow it.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ]
    )
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        _AggregatedDiscoveryService(cache), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as error:
        raise OSError(f"xDS server cannot listen on {address}: {error}") from error
    if bound == 0:
        raise OSError(f"xDS server cannot listen on {address} (port in use?)")
    await server.start()
    _log.info("xDS (ADS) server listening on %s:%d", host, bound)
    return XdsServer(host, bound, server)
