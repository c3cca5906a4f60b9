"""The ext_proc messages the LLM processor answers with: continue (optionally with a new
body and route metadata) or answer the client itself (an OpenAI-style JSON error).

Kept apart from the stream logic so the protocol's shapes (which field carries what, which
headers Envoy strips) are in one small place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from inferway._xds_protos.envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb2
from inferway._xds_protos.envoy.type.v3 import http_status_pb2
from inferway.xds.translate.llm import LLM_NAMESPACE
from inferway.xds.translate.served_by import SERVED_BY_HEADERS

__all__ = [
    "Refused",
    "error_answer",
    "error_body",
    "let_go",
    "pass_response_body",
    "pass_response_headers",
    "request_headers_continue",
    "routed_body",
]


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def let_go() -> ep_pb2.ProcessingResponse:
    """Not this processor's request: continue untouched and send it nothing more (its body
    is not buffered; the filter's ``allow_mode_override`` lets this answer say so)."""
    mode = processing_mode_pb2.ProcessingMode
    return ep_pb2.ProcessingResponse(
        request_headers=ep_pb2.HeadersResponse(),
        mode_override=mode(
            request_body_mode=mode.NONE,
            request_trailer_mode=mode.SKIP,
            response_header_mode=mode.SKIP,
            response_body_mode=mode.NONE,
            response_trailer_mode=mode.SKIP,
        ),
    )


def request_headers_continue() -> ep_pb2.ProcessingResponse:
    """Go on to the body, without its Content-Length: the body may be rewritten, and Envoy
    1.40 refuses a rewritten buffered body whose length differs from the header's while
    ignoring a new Content-Length sent with it; without one the request goes upstream
    chunked (every OpenAI-compatible server reads that)."""
    mutation = ep_pb2.HeaderMutation(remove_headers=["content-length"])
    return ep_pb2.ProcessingResponse(
        request_headers=ep_pb2.HeadersResponse(
            response=ep_pb2.CommonResponse(header_mutation=mutation)
        )
    )


def routed_body(
    model: str, body: bytes | None, stream_id: str = "", drop_usage: bool = False
) -> ep_pb2.ProcessingResponse:
    """Route on ``model`` (metadata + a cleared route cache; the cache is only cleared by an
    answer that mutates headers, hence the served-by removal), with ``body`` replacing the
    client's when given. ``stream_id`` and ``drop_usage`` are for Envoy's Lua filter
    (xds/translate/llm_stream.py): which stream its report is about, and whether it removes
    the usage chunk the gateway asked for."""
    mutation = ep_pb2.HeaderMutation(remove_headers=list(SERVED_BY_HEADERS))
    common = ep_pb2.CommonResponse(clear_route_cache=True, header_mutation=mutation)
    if body is not None:
        common.body_mutation.body = body
    answer = ep_pb2.ProcessingResponse(request_body=ep_pb2.BodyResponse(response=common))
    # set field by field: Struct.update's generic conversion was a third of the request's
    # Python time in the processor
    tags = answer.dynamic_metadata.fields[LLM_NAMESPACE].struct_value.fields
    tags["model"].string_value = model
    if stream_id:
        tags["id"].string_value = stream_id
        tags["drop_usage"].bool_value = drop_usage
    return answer


def pass_response_headers() -> ep_pb2.ProcessingResponse:
    return ep_pb2.ProcessingResponse(response_headers=ep_pb2.HeadersResponse())


def pass_response_body(replacement: bytes | None = None) -> ep_pb2.ProcessingResponse:
    """The chunk as it came (None), or ``replacement`` in its place (possibly empty)."""
    common = ep_pb2.CommonResponse()
    if replacement is not None:
        common.body_mutation.body = replacement
    return ep_pb2.ProcessingResponse(response_body=ep_pb2.BodyResponse(response=common))


@dataclass(frozen=True)
class Refused:
    """A request the gateway answers itself, with an OpenAI-style error."""

    status: int
    code: str
    message: str
    retry_after_s: int | None = None
    extra: Mapping[str, object] | None = None


def error_body(refused: Refused) -> bytes:
    """``{"error": {"message", "type", "code", ...extra}}``."""
    kind = "rate_limit_exceeded" if refused.status == 429 else "invalid_request_error"
    error: dict[str, object] = {"message": refused.message, "type": kind, "code": refused.code}
    error.update(refused.extra or {})
    return orjson.dumps({"error": error})


def error_answer(refused: Refused) -> ep_pb2.ProcessingResponse:
    """The refusal, answered by Envoy."""
    headers = ep_pb2.HeaderMutation(set_headers=[_header("content-type", "application/json")])
    if refused.retry_after_s is not None:
        headers.set_headers.append(_header("retry-after", str(refused.retry_after_s)))
    return ep_pb2.ProcessingResponse(
        immediate_response=ep_pb2.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=refused.status),  # type: ignore[arg-type]
            headers=headers,
            body=error_body(refused),
            details=f"inferway_llm_{refused.code}",
        )
    )
