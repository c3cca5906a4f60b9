"""OpenAI-compatible routes in Envoy: the external processing filter that asks inferway's LLM
processor about each request and answer, the route matchers that read its answer, and the
two routes Envoy answers itself per API prefix.

The request is held (headers and the whole body, ``BUFFERED``) while the processor reads the
body's ``model``, checks the client's token limits and rewrites the body when needed; its
answer carries ``inferway.llm`` dynamic metadata (``model``) and clears the route cache, so
Envoy matches again and the route serving that model wins. Answers never go to the
processor chunk by chunk: Envoy's Lua filter (llm_stream.py) reads them as they pass and
reports to the processor once per answer (twice or more for a long stream).

Per prefix, ``<prefix>/models`` is answered by Envoy with the models the listener serves,
and a last route catches a model no route on this listener serves (404). The filter runs on
the openai routes and that catch route only; a request reaches the catch route first (no
metadata yet), which is what makes the filter run for it. The processor fails closed
(``failure_mode_allow: false``): it is what enforces token limits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.grpc.v3 import als_pb2
from inferway._xds_protos.envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import (
    metadata_pb2,
    regex_pb2,
    string_pb2,
    value_pb2,
)
from inferway.resolve.ir.llm import LlmGatewayIR
from inferway.resolve.ir.route import RouteIR
from inferway.resolve.llm import llm_path
from inferway.xds.translate._protos import duration, pack
from inferway.xds.translate.ext_proc_request import request_body_processor
from inferway.xds.translate.grpc_access_log import grpc_log_common
from inferway.xds.translate.inline_cluster import build_inline_http2_cluster
from inferway.xds.translate.llm_stream import BACKEND_HEADER

__all__ = [
    "LLM_CLUSTER",
    "LLM_FILTER",
    "LLM_NAMESPACE",
    "LLM_REPORTS_CLUSTER",
    "UNKNOWN_MODEL_ROUTE",
    "add_llm_route",
    "build_llm_close_log",
    "build_llm_cluster",
    "build_llm_filter",
    "build_llm_reports_cluster",
    "build_models_route",
    "build_unknown_model_route",
    "disable_llm_filter",
    "drop_llm_filter_configs",
]

LLM_FILTER = "inferway.llm"
"""The ext_proc filter's name in the chain (two ext_proc filters need distinct names)."""
LLM_CLUSTER = "inferway_llm_processor"
LLM_REPORTS_CLUSTER = "inferway_llm_reports"
"""The processor's reports port: HTTP/1.1, the Lua filter's reports (llm_stream.py)."""
LLM_NAMESPACE = "inferway.llm"
UNKNOWN_MODEL_ROUTE = "llm_unknown_model_"
"""Name prefix of the catch routes (``_`` is never in a policy name)."""


def build_llm_filter(gateway: LlmGatewayIR) -> hcm_pb2.HttpFilter:
    config = request_body_processor(LLM_CLUSTER, LLM_NAMESPACE, gateway.timeout, fail_open=False)
    # answers are read by Envoy's Lua filter (llm_stream.py), which reports to the processor;
    # a request outside every openai prefix (no route of this processor) is let go at its
    # headers: the processor answers with a mode override that skips its body
    config.allow_mode_override = True
    return hcm_pb2.HttpFilter(name=LLM_FILTER, typed_config=pack(config))


CLOSE_LOG_FLUSH_S = 0.1
"""How long Envoy batches the access log entries of requests whose client went away."""


def build_llm_close_log() -> accesslog_pb2.AccessLog:
    """``transport: http``: Envoy's gRPC access log to the processor's gRPC address, only for
    a request still ``open`` in its ``inferway.llm`` metadata when it ends (admitted, its
    final report never sent: the client or the backend went away); the processor records it
    from what the Lua filter counted into that metadata."""
    config = als_pb2.HttpGrpcAccessLogConfig(
        common_config=grpc_log_common(LLM_FILTER, LLM_CLUSTER, CLOSE_LOG_FLUSH_S),
    )
    still_open = metadata_pb2.MetadataMatcher(
        filter=LLM_NAMESPACE,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key="open")],
        value=value_pb2.ValueMatcher(bool_match=True),
    )
    return accesslog_pb2.AccessLog(
        name="envoy.access_loggers.http_grpc",
        filter=accesslog_pb2.AccessLogFilter(
            metadata_filter=accesslog_pb2.MetadataFilter(matcher=still_open)
        ),
        typed_config=pack(config),
    )


def build_llm_cluster(gateway: LlmGatewayIR) -> cluster_pb2.Cluster:
    return build_inline_http2_cluster(LLM_CLUSTER, gateway.host, gateway.port, 1.0)


def build_llm_reports_cluster(gateway: LlmGatewayIR) -> cluster_pb2.Cluster:
    """HTTP/1.1 with keep-alive (the reports are plain requests, not gRPC)."""
    cluster = build_inline_http2_cluster(
        LLM_REPORTS_CLUSTER, gateway.host, gateway.reports_port, 1.0
    )
    cluster.ClearField("typed_extension_protocol_options")
    return cluster


def add_llm_route(proto: rc_pb2.Route, route: RouteIR) -> None:
    """Match the processor's ``model``; bound silence, not length (``idle_timeout``)."""
    assert route.llm is not None
    proto.match.dynamic_metadata.append(
        metadata_pb2.MetadataMatcher(
            filter=LLM_NAMESPACE,
            path=[metadata_pb2.MetadataMatcher.PathSegment(key="model")],
            value=value_pb2.ValueMatcher(
                string_match=string_pb2.StringMatcher(exact=route.llm.model)
            ),
        )
    )
    proto.route.idle_timeout.CopyFrom(duration(route.llm.idle_timeout))
    proto.response_headers_to_add.append(  # the backend label; the Lua filter removes it
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=BACKEND_HEADER, value="%UPSTREAM_CLUSTER%"),
            append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    )


def disable_llm_filter(proto: rc_pb2.Route) -> None:
    proto.typed_per_filter_config[LLM_FILTER].CopyFrom(
        pack(ext_proc_pb2.ExtProcPerRoute(disabled=True))
    )


def drop_llm_filter_configs(config: route_pb2.RouteConfiguration) -> None:
    """``llm.transport: http``: no ``inferway.llm`` ext_proc filter is in the chain, so the
    routes' settings for it (``disable_llm_filter``) go."""
    for host in config.virtual_hosts:
        for proto in host.routes:
            if LLM_FILTER in proto.typed_per_filter_config:
                del proto.typed_per_filter_config[LLM_FILTER]


def _json_answer(name: str, match: rc_pb2.RouteMatch, status: int, body: object) -> rc_pb2.Route:
    return rc_pb2.Route(
        name=name,
        stat_prefix=name,
        match=match,
        direct_response=rc_pb2.DirectResponseAction(
            status=status, body=base_pb2.DataSource(inline_string=json.dumps(body, sort_keys=True))
        ),
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", value="application/json"),
                append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
    )


def _suffix(prefix: str) -> str:
    """``/v1`` -> ``v1``, ``/openai/v1`` -> ``openai_v1`` (route names stay one token)."""
    return prefix.strip("/").replace("/", "_").replace("-", "_") or "root"


def build_models_route(prefix: str, routes: Sequence[RouteIR]) -> rc_pb2.Route:
    """``GET <prefix>/models``: every model (aliases too) the listener serves there."""
    names = sorted({n for r in routes if r.llm for n in (r.llm.model, *r.llm.aliases)})
    body = {
        "object": "list",
        "data": [{"id": n, "object": "model", "owned_by": "inferway"} for n in names],
    }
    match = rc_pb2.RouteMatch(path=f"{prefix}/models")
    proto = _json_answer(f"llm_models_{_suffix(prefix)}", match, 200, body)
    disable_llm_filter(proto)
    return proto


def build_unknown_model_route(prefix: str) -> rc_pb2.Route:
    """The last route for the prefix's endpoints: the body named no model this listener
    serves (the processor refuses models no route serves at all, with the name)."""
    body = {
        "error": {
            "code": "model_not_found",
            "message": f"no route on this listener serves the request's model under {prefix}",
            "type": "invalid_request_error",
        }
    }
    match = rc_pb2.RouteMatch(safe_regex=regex_pb2.RegexMatcher(regex=llm_path(prefix).value))
    return _json_answer(f"{UNKNOWN_MODEL_ROUTE}{_suffix(prefix)}", match, 404, body)
