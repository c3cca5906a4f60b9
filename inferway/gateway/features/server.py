"""The feature router's gRPC server: Envoy's external processor (``envoy.service.ext_proc``)
in the control plane process, and the observer that keeps it where the live policy says.

Per request Envoy opens one stream, sends the headers, then the whole body (``BUFFERED``);
the answer to the body carries the measured features as dynamic metadata and clears the
route cache, so Envoy matches its routes again with them. A request without a body is
answered at its headers (``json: false``). The route cache is only cleared when an answer
mutates headers (Envoy counts ``clear_route_cache_ignored`` otherwise), so every answer also
removes the served-by headers from the request, which Envoy's route config strips anyway.

A failure here never fails a request: Envoy is configured with ``failure_mode_allow``, so a
stream error, a crash or a stopped server means the request is routed without features.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2 as ep_pb2,
)
from inferway._xds_protos.envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)
from inferway.gateway.control_plane import AppliedPolicy, ControlPlane, PolicyFollower
from inferway.gateway.ext_proc_passthrough import passthrough
from inferway.gateway.features.measure import (
    BINARY_HEADER_LENGTH,
    measure_body,
    measure_bodyless,
    parse_field_paths,
)
from inferway.gateway.grpc_listen import listen_and_start
from inferway.policies.model import Policy
from inferway.xds.translate.features import FEATURES_NAMESPACE, FIELDS_METADATA_KEY
from inferway.xds.translate.served_by import SERVED_BY_HEADERS

__all__ = ["FeatureRouter", "FeatureRouterKeeper", "wanted_address"]

log = logging.getLogger(__name__)


def _header(headers: ep_pb2.HttpHeaders, name: str) -> str | None:
    for header in headers.headers.headers:
        if header.key == name:
            raw: bytes = header.raw_value
            return raw.decode("latin-1") if raw else str(header.value)
    return None


def _json_length(value: str | None) -> int | None:
    if value is None or not (value.isascii() and value.strip().isdigit()):
        return None
    return int(value)


def _routed() -> ep_pb2.CommonResponse:
    """Clear the route cache (the features travel beside it, as dynamic metadata)."""
    return ep_pb2.CommonResponse(
        clear_route_cache=True,
        header_mutation=ep_pb2.HeaderMutation(remove_headers=list(SERVED_BY_HEADERS)),
    )


def _metadata(features: dict[str, Any]) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.update({FEATURES_NAMESPACE: features})
    return metadata


class _Processor(ep_grpc.ExternalProcessorServicer):
    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0

    async def Process(
        self, request_iterator: AsyncIterator[ep_pb2.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep_pb2.ProcessingResponse]:
        metadata = dict(context.invocation_metadata() or ())
        fields = parse_field_paths(metadata.get(FIELDS_METADATA_KEY))
        json_length: int | None = None
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    self.requests += 1
                    headers = request.request_headers
                    json_length = _json_length(_header(headers, BINARY_HEADER_LENGTH))
                    if headers.end_of_stream:
                        features = measure_bodyless(_header(headers, ":method"))
                        yield ep_pb2.ProcessingResponse(
                            request_headers=ep_pb2.HeadersResponse(response=_routed()),
                            dynamic_metadata=_metadata(features),
                        )
                    else:
                        yield ep_pb2.ProcessingResponse(request_headers=ep_pb2.HeadersResponse())
                elif kind == "request_body":
                    features = measure_body(
                        request.request_body.body, fields, json_length=json_length
                    )
                    yield ep_pb2.ProcessingResponse(
                        request_body=ep_pb2.BodyResponse(response=_routed()),
                        dynamic_metadata=_metadata(features),
                    )
                else:  # not asked for by inferway's processing mode: pass it through
                    yield passthrough(kind)
        except Exception:  # Envoy routes without features (failure_mode_allow)
            self.errors += 1
            log.exception("feature router: a stream failed; Envoy routes it without features")


class FeatureRouter:
    """One gRPC server on ``host:port`` (port 0: the OS picks; ``port`` tells)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.processor = _Processor()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> FeatureRouter:
        server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(self.processor, server)
        self.port = await listen_and_start(server, self.host, self.port, "feature router")
        self._server = server
        return self

    async def stop(self, grace: float = 0.2) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)


def wanted_address(policy: Policy) -> tuple[str, int] | None:
    """Where the policy wants the router: only when a route matches on features."""
    if not any(r.match.features is not None for r in policy.routes):
        return None
    return policy.feature_router.address, policy.feature_router.port


class FeatureRouterKeeper(PolicyFollower):
    """Runs the router while the live policy has feature routes, at the address it names:
    started before Envoy gets the first snapshot that uses it, moved or stopped by edits."""

    def __init__(self, plane: ControlPlane, policy: Policy) -> None:
        """Follows ``plane`` from ``policy`` (its live one) on, once started."""
        self._plane = plane
        self._initial = policy
        self.router: FeatureRouter | None = None
        self._pending: asyncio.Task[None] | None = None

    async def follow(self, policy: Policy) -> None:
        wanted = wanted_address(policy)
        current = None if self.router is None else (self.router.host, self.router.port)
        if wanted == current:
            return
        if self.router is not None:
            await self.router.stop()
            self.router = None
        if wanted is not None:
            self.router = await FeatureRouter(*wanted).start()

    async def start(self) -> None:
        """Serve what the live policy asks for, then follow the control plane's applies."""
        await self.follow(self._initial)
        self._plane.add_observer(self)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._pending = asyncio.get_running_loop().create_task(self._follow(applied.policy))

    async def _follow(self, policy: Policy) -> None:
        try:
            await self.follow(policy)
        except OSError as error:  # Envoy routes without features until an edit fixes it
            log.error("%s; routes with features fall back to the next route", error)

    async def stop(self) -> None:
        if self._pending is not None:
            await self._pending
        if self.router is not None:
            await self.router.stop()
            self.router = None
