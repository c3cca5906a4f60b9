"""The Lua filter that reads streamed OpenAI answers in Envoy (``xds/translate/llm_stream.py``),
run on LuaJIT in this process (lupa) with a stand-in for the handle Envoy passes to
``envoy_on_response``: the answer's headers, the request's ``inferway.llm`` metadata, the
body's chunks (each one's bytes as the script leaves them) and the reports it posts. Only the
handle is stood in for; the script is the one the translator sends Envoy, word for word."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lupa.luajit21 import LuaRuntime

from inferway.xds.translate.llm_stream import stream_script

_HANDLE = r"""
EnvoyTimestampResolution = {MILLISECOND = 0, MICROSECOND = 1}
return function(headers, meta, parts, calls)
  local h = {hdrs = headers, out = {}, now = 1000000}
  local hdr = {}
  function hdr:get(k) return h.hdrs[k] end
  function hdr:replace(k, v) h.hdrs[k] = v end
  function hdr:remove(k) h.hdrs[k] = nil end
  function h:headers() return hdr end
  local dyn = {}
  function dyn:get(ns) return meta[ns] end
  function dyn:set(ns, k, v) meta[ns] = meta[ns] or {}; meta[ns][k] = v end
  local info = {}
  function info:dynamicMetadata() return dyn end
  function info:routeName() return "llm" end
  function h:streamInfo() return info end
  function h:timestampString(_) h.now = h.now + 1; return tostring(h.now) end
  function h:httpCall(cluster, hs, body, timeout, async)
    calls[#calls + 1] = body
    return {[":status"] = "200"}, ""
  end
  function h:bodyChunks()
    local i = 0
    return function()
      i = i + 1
      if parts[i] == nil then return nil end
      local c, n = {}, i  -- the chunk stays writable after the loop, as the last one is
      h.out[n] = parts[n]
      function c:length() return #h.out[n] end
      function c:getBytes(at, count) return string.sub(h.out[n], at + 1, at + count) end
      function c:setBytes(s) h.out[n] = s end
      return c
    end
  end
  return h
end
"""


@dataclass
class Answer:
    passed: bytes
    """What the client gets: every chunk's bytes as the filter left them."""
    reports: list[dict[str, Any]]
    headers: dict[str, str]


class LuaStream:
    def __init__(self) -> None:
        self.lua = LuaRuntime(unpack_returned_tuples=True, encoding=None)
        script = stream_script("inferway_llm_reports", admit=True, local_models={"m": "m"})
        self.lua.execute(script.encode())
        self._handle = self.lua.execute(_HANDLE.encode())

    def answer(
        self, parts: Sequence[bytes], *, drop: bool, content_type: str = "text/event-stream"
    ) -> Answer:
        """``parts``: the answer's body as Envoy hands it to the filter, chunk by chunk."""
        table = self.lua.table_from
        headers = table({b":status": b"200", b"content-type": content_type.encode()})
        meta = table({b"inferway.llm": table({b"id": b"e1-2-3", b"drop_usage": drop})})
        calls = table({})
        handle = self._handle(headers, meta, table(list(parts)), calls)
        self.lua.globals()[b"envoy_on_response"](handle)
        out = handle[b"out"]
        passed = b"".join(out[i] for i in range(1, len(parts) + 1))
        reports = [json.loads(bytes(calls[i]).split(b"\n", 1)[0]) for i in range(1, len(calls) + 1)]
        result_headers = {bytes(k).decode(): bytes(v).decode() for k, v in headers.items()}
        return Answer(passed, reports, result_headers)
