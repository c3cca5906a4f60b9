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

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.filters.http.lua.v3 import lua_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
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
    "STREAM_FILTER",
    "build_stream_filter",
    "disable_stream_filter",
    "stream_script",
]

STREAM_FILTER = "inferway.llm_stream"
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
BACKEND_HEADER = "x-inferway-llm-backend"
"""Added by an openai route to its answers (``%UPSTREAM_CLUSTER%``); the script reads it for
the ``backend`` label and removes it before the client sees it."""
MAX_PLAIN_ANSWER = 16 * 1024 * 1024
"""A plain (non-streamed) answer is sent to the processor for its ``usage`` up to this size
(embeddings can be large); past it the answer still passes whole, its tokens estimated."""
"""Tokens between two progress reports (the first token is always reported)."""

_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")

_SCRIPT = r"""
local NS = "inferway.llm"
local CLUSTER = "@CLUSTER@"
local PATH = "@PATH@"
local EVERY = @EVERY@
local BACKEND = "@BACKEND@"
local MAX_PLAIN = @MAX_PLAIN@
local SEPARATORS = {"\r\n\r\n", "\n\n", "\r\r"}
local ADMIT = "@ADMIT@"
local KEY = "@KEY@"
local ADMIT_TIMEOUT = @ADMIT_TIMEOUT@
local SERVED_BY = {@SERVED_BY@}
local UNREACHABLE = '{"error":{"code":"llm_processor_unavailable","type":"api_error",'
  .. '"message":"the gateway could not ask its LLM processor about this request"}}'

@LOCAL_ADMIT@

local function unquote(s)
  return (string.gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- llm.transport http: the processor is asked once, with the whole body, over the reports
-- cluster (plain HTTP/1.1); no ext_proc filter is in the chain then
function envoy_on_request(handle)
  if ADMIT == "" then return end
  local headers = handle:headers()
  local call = {[":method"] = "POST", [":path"] = ADMIT, [":authority"] = CLUSTER,
    ["x-inferway-path"] = headers:get(":path") or "",
    ["x-inferway-started"] = handle:timestampString(EnvoyTimestampResolution.MICROSECOND)}
  local key = headers:get(KEY)
  if key ~= nil then call["x-inferway-key"] = key end
  local authorization = headers:get("authorization")
  if authorization ~= nil then call["x-inferway-authorization"] = authorization end
  if admit_here(handle, call) then return end
  local body = handle:body()
  local bytes = ""
  if body == nil then
    call["x-inferway-no-body"] = "1"
  elseif body:length() > 0 then
    bytes = body:getBytes(0, body:length())
  end
  local answer, content = handle:httpCall(CLUSTER, call, bytes, ADMIT_TIMEOUT, false)
  local status = answer[":status"]
  if answer["x-inferway-llm-refusal"] ~= nil then
    local out = {[":status"] = status, ["content-type"] = "application/json"}
    if answer["retry-after"] ~= nil then out["retry-after"] = answer["retry-after"] end
    handle:respond(out, content)
    return
  end
  if status ~= "200" then  -- fails closed: the processor is what enforces limits
    handle:respond({[":status"] = "503", ["content-type"] = "application/json"}, UNREACHABLE)
    return
  end
  local model = answer["x-inferway-llm-model"]
  if model == nil then return end  -- not an openai request: let go
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NS, "model", unquote(model))
  meta:set(NS, "id", answer["x-inferway-llm-id"])
  meta:set(NS, "drop_usage", answer["x-inferway-llm-drop-usage"] == "1")
  meta:set(NS, "open", true)  -- until its final report: Envoy's access log tells otherwise
  -- the call suspended the script: its headers and body objects are fetched again
  headers = handle:headers()
  if answer["x-inferway-llm-rewritten"] == "1" then
    handle:body():setBytes(content)
    headers:replace("content-length", tostring(#content))
  end
  for _, name in ipairs(SERVED_BY) do headers:remove(name) end
  handle:clearRouteCache()
end

local function boundary(s, init)
  local first, last
  for _, sep in ipairs(SEPARATORS) do
    local a, b = string.find(s, sep, init, true)
    if a and (first == nil or a < first) then first, last = a, b end
  end
  return first, last
end

-- plain finds first (memchr-fast): most events are text chunks, checked by three of them
local function has(s, plain, pattern, init)
  local at = string.find(s, plain, init, true)
  return at ~= nil and string.find(s, pattern, at) ~= nil
end

local function account(t, event, now)
  if string.find(event, "[DONE]", 1, true) and (string.find(event, "^%s*data:%s*%[DONE%]")
      or string.find(event, "\ndata:%s*%[DONE%]")) then
    t.done = true
    return false
  end
  if not string.find(event, "data", 1, true) then return false end
  if t.model == nil then
    local model = string.match(event, '"model"%s*:%s*"([^"\\]*)"')
    if model and model ~= "" then t.model = model end
  end
  local usage_only = false
  local at = string.find(event, '"usage"', 1, true)
  if at then at = string.find(event, '"usage"%s*:%s*{', at) end
  if at then
    local prompt = string.match(event, '"prompt_tokens"%s*:%s*(%d+)', at)
    if prompt then
      t.prompt = prompt
      t.completion = string.match(event, '"completion_tokens"%s*:%s*(%d+)', at) or "0"
      usage_only = not string.find(event, '"choices"%s*:%s*%[%s*[^%]%s]')
    end
  end
  if has(event, '"content"', '"content"%s*:%s*"[^"]') or has(event, '"text"', '"text"%s*:%s*"[^"]')
      or has(event, '"tool_calls"', '"tool_calls"%s*:%s*%[%s*[^%]%s]') then
    t.chunks = t.chunks + 1
    if t.first == nil then t.first = now end
    t.last = now
  end
  return usage_only
end

local function report(handle, id, t, final, plain)
  local body = string.format(
    '{"id":"%s","final":%s,"status":%d,"route":"%s","backend":"%s","sse":%s,"chunks":%d,'
    .. '"first":%s,"last":%s,"prompt":%s,"completion":%s,"model":"%s","done":%s,'
    .. '"overflow":%s}\n',
    id, tostring(final), t.status, t.route, t.backend, tostring(t.sse), t.chunks,
    t.first or "null", t.last or "null", t.prompt or "null", t.completion or "null",
    t.model or "", tostring(t.done == true), tostring(t.overflow == true))
  if plain ~= nil then body = body .. plain end
  local headers = {[":method"] = "POST", [":path"] = PATH, [":authority"] = CLUSTER,
    ["content-type"] = "application/json"}
  local answer = handle:httpCall(CLUSTER, headers, body, 5000, not final)
  if final and ADMIT ~= "" and answer ~= nil and answer[":status"] == "200" then
    -- recorded: no access log entry is needed for it
    handle:streamInfo():dynamicMetadata():set(NS, "open", false)
  end
end

-- llm.transport http: what has been counted so far goes into the request's metadata instead
-- of a report; Envoy's access log sends it to the processor if the answer never ends here
-- (the client went away), and the request is recorded from it
local function progress(handle, id, t)
  if ADMIT == "" then return report(handle, id, t, false) end
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NS, "chunks", t.chunks)
  if t.first ~= nil then meta:set(NS, "first", t.first) end
  if t.last ~= nil then meta:set(NS, "last", t.last) end
end

-- the answer's headers, for a request whose client goes before its end (llm.transport http)
local function answered(handle, t)
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NS, "status", t.status)
  meta:set(NS, "route", t.route)
  meta:set(NS, "backend", t.backend)
  meta:set(NS, "sse", t.sse)
end

local function safe(value)
  if value == nil or string.find(value, '["\\%c]') then return "" end
  return value
end

local function plain_answer(handle, id, t)
  local parts, size = {}, 0
  for chunk in handle:bodyChunks() do
    local n = chunk:length()
    if n > 0 and not t.overflow then
      if size + n <= MAX_PLAIN then
        parts[#parts + 1] = chunk:getBytes(0, n)
        size = size + n
      else
        t.overflow = true
      end
    end
  end
  if t.overflow then parts = {} end
  report(handle, id, t, true, table.concat(parts))
end

function envoy_on_response(handle)
  local meta = handle:streamInfo():dynamicMetadata():get(NS)
  local headers = handle:headers()
  local backend = headers:get(BACKEND)
  headers:remove(BACKEND)
  if meta == nil or meta["id"] == nil then return end
  local id, drop = meta["id"], meta["drop_usage"] == true
  local kind = string.lower(headers:get("content-type") or "")
  local t = {chunks = 0, status = tonumber(headers:get(":status")) or 0,
    route = safe(handle:streamInfo():routeName()), backend = safe(backend),
    sse = string.find(kind, "^%s*text/event%-stream") ~= nil}
  if ADMIT ~= "" then answered(handle, t) end
  if not t.sse then
    local length = tonumber(headers:get("content-length") or "")
    if length ~= nil and length <= MAX_PLAIN then
      -- held whole (the client cannot use part of a JSON answer) until it is recorded
      local body = handle:body()
      local size = body and body:length() or 0
      report(handle, id, t, true, size > 0 and body:getBytes(0, size) or "")
      return
    end
    -- without a length, the client knows the answer ended when its last frame came, which
    -- waits for the report: the next request sees this one's debit
    headers:remove("content-length")
    return plain_answer(handle, id, t)
  end
  if drop then headers:remove("content-length") end  -- the answer may get shorter
  local tail, reported = "", 0
  local last, last_out
  for chunk in handle:bodyChunks() do
    local size = chunk:length()
    local data = tail
    if size > 0 then data = tail .. chunk:getBytes(0, size) end
    local now = handle:timestampString(EnvoyTimestampResolution.MICROSECOND)
    local kept, dropped = drop and {} or nil, false
    local lf_only = string.find(data, "\r", 1, true) == nil  -- the usual "\n\n" events
    local pos = 1
    while true do
      local a, b
      if lf_only then
        a, b = string.find(data, "\n\n", pos, true)
      else
        a, b = boundary(data, pos)
      end
      if a == nil then break end
      local event = (pos == 1 and b == #data) and data or string.sub(data, pos, b)
      if account(t, event, now) and drop then
        dropped = true
      elseif drop then
        kept[#kept + 1] = event
      end
      pos = b + 1
    end
    local carried = tail ~= ""
    tail = pos > #data and "" or string.sub(data, pos)
    if drop then
      -- only whole events go on (a usage chunk may come split): the chunk is rewritten when
      -- an event was dropped or one is split across chunks, and passed as it is otherwise
      if dropped or carried or tail ~= "" then
        last_out = table.concat(kept)
        chunk:setBytes(last_out)
      else
        last_out = data
      end
    end
    last = chunk
    if t.chunks > reported and (reported == 0 or t.chunks - reported >= EVERY) then
      reported = t.chunks
      progress(handle, id, t)
    end
  end
  if tail ~= "" then
    local now = handle:timestampString(EnvoyTimestampResolution.MICROSECOND)
    local dropped = string.find(tail, "%S") and account(t, tail, now) and drop
    if drop and last ~= nil and not dropped then last:setBytes(last_out .. tail) end
  end
  report(handle, id, t, true)
end
"""


def stream_script(
    cluster: str,
    max_plain: int = MAX_PLAIN_ANSWER,
    *,
    admit: bool = False,
    client_header: str = "x-api-key",
    admit_timeout_s: float = 5.0,
    local_models: Mapping[str, str] | None = None,
    asking: Collection[str] = (),
) -> str:
    """The Lua source, reporting to the processor's reports ``cluster``; plain answers of up to
    ``max_plain`` bytes are held whole in Envoy (its buffer limit bounds it) and read.
    ``admit``: the script also asks the processor about each request there
    (``llm.transport: http``), forwarding ``client_header``, waiting up to
    ``admit_timeout_s``. ``local_models`` (every name and alias -> the served name; None:
    never) lets it admit plain requests itself (llm_local_admit.py), adding
    ``include_usage`` to the streams of the ``asking`` models."""
    if not _HEADER_NAME.fullmatch(client_header):
        raise ValueError(f"client key header {client_header!r} is not a header name")
    return (
        _SCRIPT.replace(
            "@LOCAL_ADMIT@", local_admit_source(local_models if admit else None, asking)
        )
        .replace("@ADMIT@", ADMIT_PATH if admit else "")
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
    )
    source = base_pb2.DataSource(inline_string=script)
    config = lua_pb2.Lua(default_source_code=source)
    return hcm_pb2.HttpFilter(name=STREAM_FILTER, typed_config=pack(config))


def disable_stream_filter(proto: rc_pb2.Route) -> None:
    proto.typed_per_filter_config[STREAM_FILTER].CopyFrom(pack(lua_pb2.LuaPerRoute(disabled=True)))
