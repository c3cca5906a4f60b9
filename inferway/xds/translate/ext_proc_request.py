"""The external processor inferway's own gRPC peers get (the feature router, a picker, the LLM
processor on ``transport: ext_proc``): the request's headers and its whole body, nothing of
the answer, and the metadata it sets read back in one namespace."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.core.v3 import base_pb2, grpc_service_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import (
    ext_proc_pb2,
    processing_mode_pb2,
)
from inferway.xds.translate._protos import duration

__all__ = ["request_body_processor"]


def request_body_processor(
    cluster: str,
    namespace: str,
    timeout: float,
    *,
    fail_open: bool,
    metadata: tuple[str, str] | None = None,
) -> ext_proc_pb2.ExternalProcessor:
    """``cluster`` is asked with each request's headers and buffered body within ``timeout``
    seconds (``fail_open``: a request it cannot answer goes on unprocessed); it may set
    untyped metadata in ``namespace``; ``metadata``, one (key, value) it gets as gRPC initial
    metadata on every stream. The headers are sent too: with them skipped, Envoy routes
    before the body is read."""
    mode = processing_mode_pb2.ProcessingMode
    service = grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster)
    )
    if metadata is not None:
        service.initial_metadata.append(base_pb2.HeaderValue(key=metadata[0], value=metadata[1]))
    return ext_proc_pb2.ExternalProcessor(
        grpc_service=service,
        failure_mode_allow=fail_open,
        message_timeout=duration(timeout),
        processing_mode=mode(
            request_header_mode=mode.SEND,
            request_body_mode=mode.BUFFERED,
            request_trailer_mode=mode.SKIP,
            response_header_mode=mode.SKIP,
            response_body_mode=mode.NONE,
            response_trailer_mode=mode.SKIP,
        ),
        metadata_options=ext_proc_pb2.MetadataOptions(
            receiving_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=[namespace]
            )
        ),
    )
