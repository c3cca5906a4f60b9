"""The Lua filter that reads streamed OpenAI answers inside Envoy, so the LLM processor is
asked once per stream instead of once per chunk.

Every chunk of a streamed answer (``text/event-stream``) used to be one synchronous gRPC
round trip to the Python processor: 100-200 us of its CPU per token, and under load a
queue every stream's first token waited in. Here Envoy's Lua filter (LuaJIT, in Envoy's
worker) splits the stream into events, counts the chunks with generated text, times the
first and last of them, reads the ``usage`` chunk and, for a client that did not ask for
usage (the processor's ``drop_usage`` metadata), removes that chunk from the bytes it passes
on. The processor hears from it a few times per stream, on its reports port (plain HTTP/1.1
``POST /inferway/llm/report``, a JSON line then a plain answer's bytes):

- once a stream has its first token (and every 16 tokens after it), without waiting
  (``asynchronous``): what has been counted so far, so a stream the client abandons is
  still counted by the chunks seen;
- at the end of the answer, synchronously, before the last chunk is passed on: the usage,
  the chunk count and the token times; the processor records the request (metrics, the
  budget's debit, a span) before the client has its answer.

The script acts only on answers the processor tagged (``inferway.llm`` metadata ``id``,
set when it read the request's body); any other answer is left alone. The processor tells
Envoy not to send it the bodies of those streams (``mode_override``); plain JSON answers
still go to it whole.

Why plain HTTP and not a gRPC method on the processor's ext_proc server: each report was a
unary gRPC call, about 0.45 ms of the processor's CPU (grpc.aio's per-call work), three per
32-token stream, more than the ext_proc stream itself; an HTTP/1.1 request to an asyncio
protocol costs a small fraction of that (bench/llm_gateway_overhead.py measures both sides).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from importlib import resources

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.dynamic_modules.v3 import (
    dynamic_modules_pb2 as dm_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.http.dynamic_modules.v3 import (
    dynamic_modules_pb2 as dm_filter_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.http.lua.v3 import lua_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.xds.sse_module_build import SSE_MODULE
from inferway.xds.translate._protos import pack
from inferway.xds.translate.llm_local_admit import local_admit_source
from inferway.xds.translate.served_by import SERVED_BY_HEADERS

__all__ = [
    "ADMIT_PATH",
    "ANSWER_DROP_USAGE",
    "ANSWER_ID",
    "ANSWER_MODEL",
    "ANSWER_REFUSAL",
    "ANSWER_REWRITTEN",
    "BACKEND_HEADER",
    "FORWARDED_AUTHORIZATION",
    "FORWARDED_KEY",
    "FORWARDED_NO_BODY",
    "FORWARDED_PATH",
    "FORWARDED_PREFIX",
    "FORWARDED_STARTED",
    "MAX_PLAIN_ANSWER",
    "REPORT_PATH",
    "SSE_MODULE_FILTER",
    "STREAM_FILTER",
    "build_sse_module_filter",
    "build_stream_filter",
    "disable_stream_filter",
    "stream_script",
]

STREAM_FILTER = "inferway.llm_stream"
SSE_MODULE_FILTER = "inferway.llm_sse"
REPORT_PATH = "/inferway/llm/report"
"""Where the script posts its reports on the processor's reports port (JSON in, an empty
200 out)."""
ADMIT_PATH = "/inferway/llm/admit"
"""Where the script asks the processor about a request (``llm.transport: http``)."""
FORWARDED_PREFIX = "x-inferway-"
FORWARDED_PATH = "x-inferway-path"
FORWARDED_KEY = "x-inferway-key"
"""The client key header's value (the policy's ``llm.client_key.header``)."""
FORWARDED_AUTHORIZATION = "x-inferway-authorization"
FORWARDED_NO_BODY = "x-inferway-no-body"
FORWARDED_STARTED = "x-inferway-started"
"""When the request's headers reached the filter (wall-clock microseconds): TTFT's start."""
ANSWER_MODEL = "x-inferway-llm-model"
ANSWER_ID = "x-inferway-llm-id"
ANSWER_DROP_USAGE = "x-inferway-llm-drop-usage"
ANSWER_REWRITTEN = "x-inferway-llm-rewritten"
ANSWER_REFUSAL = "x-inferway-llm-refusal"
PROGRESS_EVERY = 16
"""Tokens between two progress reports (the first token is always reported)."""
BACKEND_HEADER = "x-inferway-llm-backend"
"""Added by an openai route to its answers (``%UPSTREAM_CLUSTER%``); the script reads it for
the ``backend`` label and removes it before the client sees it."""
MAX_PLAIN_ANSWER = 16 * 1024 * 1024
"""A plain (non-streamed) answer is sent to the processor for its ``usage`` up to this size
(embeddings can be large); past it the answer still passes whole, its tokens estimated."""

_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")

_SCRIPT = resources.files("inferway.xds.translate").joinpath("llm_stream.lua").read_text()
"""The script, with ``@NAME@`` placeholders :func:`stream_script` fills."""


def stream_script(
    cluster: str,
    max_plain: int = MAX_PLAIN_ANSWER,
    *,
    admit: bool = False,
    client_header: str = "x-api-key",
    admit_timeout_s: float = 5.0,
    local_models: Mapping[str, str] | None = None,
    asking: Collection[str] = (),
    native: bool = False,
) -> str:
    """The Lua source, reporting to the processor's reports ``cluster``; plain answers of up to
    ``max_plain`` bytes are held whole in Envoy (its buffer limit bounds it) and read.
    ``admit``: the script also asks the processor about each request there
    (``llm.transport: http``), forwarding ``client_header``, waiting up to
    ``admit_timeout_s``. ``local_models`` (every name and alias -> the served name; None:
    never) lets it admit plain requests itself (llm_local_admit.py), adding
    ``include_usage`` to the streams of the ``asking`` models. ``native``: inferway's SSE
    module (``sse_module_filter``, after this filter) reads the streams; the script waits for
    a stream's end and reports what the module counted."""
    if not _HEADER_NAME.fullmatch(client_header):
        raise ValueError(f"client key header {client_header!r} is not a header name")
    return (
        _SCRIPT.replace(
            "@LOCAL_ADMIT@", local_admit_source(local_models if admit else None, asking)
        )
        .replace("@ADMIT@", ADMIT_PATH if admit else "")
        .replace("@NATIVE@", "true" if native else "false")
        .replace("@KEY@", client_header.lower())
        .replace("@ADMIT_TIMEOUT@", str(max(1, round(admit_timeout_s * 1000))))
        .replace("@SERVED_BY@", ", ".join(f'"{name}"' for name in SERVED_BY_HEADERS))
        .replace("@CLUSTER@", cluster)
        .replace("@PATH@", REPORT_PATH)
        .replace("@EVERY@", str(PROGRESS_EVERY))
        .replace("@BACKEND@", BACKEND_HEADER)
        .replace("@MAX_PLAIN@", str(min(max_plain, MAX_PLAIN_ANSWER)))
    )


def build_stream_filter(
    cluster: str,
    max_plain: int,
    *,
    admit: bool = False,
    client_header: str = "x-api-key",
    admit_timeout_s: float = 5.0,
    local_models: Mapping[str, str] | None = None,
    asking: Collection[str] = (),
    native: bool = False,
) -> hcm_pb2.HttpFilter:
    """``max_plain``: the listener's buffer limit (``llm.max_body_bytes``); the rest as for
    :func:`stream_script`."""
    script = stream_script(
        cluster,
        max_plain,
        admit=admit,
        client_header=client_header,
        admit_timeout_s=admit_timeout_s,
        local_models=local_models,
        asking=asking,
        native=native,
    )
    source = base_pb2.DataSource(inline_string=script)
    config = lua_pb2.Lua(default_source_code=source)
    return hcm_pb2.HttpFilter(name=STREAM_FILTER, typed_config=pack(config))


def build_sse_module_filter() -> hcm_pb2.HttpFilter:
    """inferway's native SSE reader (``inferway/xds/sse_module``), loaded by Envoy as
    ``libinferway_sse.so`` from its module search path; it acts only on streamed answers the
    processor tagged, and goes right after the Lua filter (it sees each chunk first)."""
    config = dm_filter_pb2.DynamicModuleFilter(
        dynamic_module_config=dm_pb2.DynamicModuleConfig(name=SSE_MODULE),
        filter_name=SSE_MODULE_FILTER,
    )
    return hcm_pb2.HttpFilter(name=SSE_MODULE_FILTER, typed_config=pack(config))


def disable_stream_filter(proto: rc_pb2.Route) -> None:
    proto.typed_per_filter_config[STREAM_FILTER].CopyFrom(pack(lua_pb2.LuaPerRoute(disabled=True)))
