"""The empty answer to an ext_proc message a processor has nothing to change in: the same
phase's response with no mutation, so Envoy carries on. Shared by the LLM processor, the
feature router and the endpoint picker (each answers the phases its processing mode asks for,
and passes through any other)."""

from __future__ import annotations

from inferway._xds_protos.envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb2

__all__ = ["passthrough"]

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
