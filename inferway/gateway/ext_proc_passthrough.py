"""The empty answer to an ext_proc message a processor has nothing to change in: the same
phase's response with no mutation, so Envoy carries on; and, for a body Envoy streams to the
processor (``FULL_DUPLEX_STREAMED``), the answer that sends body bytes on (Envoy forwards only
what comes back). Shared by the LLM processor, the feature router and the endpoint picker
(each answers the phases its processing mode asks for, and passes through any other)."""

from __future__ import annotations

from inferway._xds_protos.envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb2

__all__ = ["passthrough", "streamed_body"]

_EMPTY = {
    "request_headers": ep_pb2.HeadersResponse,
    "request_body": ep_pb2.BodyResponse,
    "request_trailers": ep_pb2.TrailersResponse,
    "response_headers": ep_pb2.HeadersResponse,
    "response_body": ep_pb2.BodyResponse,
    "response_trailers": ep_pb2.TrailersResponse,
}


def passthrough(kind: str | None) -> ep_pb2.ProcessingResponse:
    """The no-change answer to a ``ProcessingRequest`` whose oneof is ``kind`` (an unknown
    kind gets the trailers' answer, the last phase)."""
    phase = kind if kind in _EMPTY else "response_trailers"
    assert phase is not None
    return ep_pb2.ProcessingResponse(**{phase: _EMPTY[phase]()})


def streamed_body(body: bytes, end_of_stream: bool) -> ep_pb2.ProcessingResponse:
    """Request body bytes for the upstream, in ``FULL_DUPLEX_STREAMED`` mode."""
    common = ep_pb2.CommonResponse()
    streamed = common.body_mutation.streamed_response
    streamed.body = body
    streamed.end_of_stream = end_of_stream
    return ep_pb2.ProcessingResponse(request_body=ep_pb2.BodyResponse(response=common))
