"""The Lua picker Envoy runs (``picker: {process: envoy, pick: score}``), run on LuaJIT in this
process (lupa) with a stand-in for the handle Envoy's Lua filter passes: the headers, the
body, the route's metadata, the dynamic metadata, ``respond`` and the response's body. Only
the handle is stood in for; the script is the one the translator sends Envoy, word for word.
The clock is the test's (``os.time``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lupa.luajit21 import LuaRuntime

from inferway.resolve.ir.picker import PickerIR, ReplicaLoadIR
from inferway.xds.translate.picker_score import load_metadata, score_script

_HANDLE = r"""
return function(body, headers, route_meta, dm)
  local h = {hdrs = headers, dm = dm or {}, responded = nil, chunks = 0}
  local hdr = {}
  function hdr:get(k) return h.hdrs[k] end
  function hdr:replace(k, v) h.hdrs[k] = v end
  function hdr:remove(k) h.hdrs[k] = nil end
  function h:headers() return hdr end
  function h:body()
    if body == nil then return nil end
    local b = {}
    function b:length() return #body end
    function b:getBytes(i, n) return string.sub(body, i + 1, i + n) end
    return b
  end
  local md = {}
  function md:get(k) return route_meta[k] end
  function h:metadata() return md end
  local dyn = {}
  function dyn:set(ns, k, v) h.dm[ns] = h.dm[ns] or {}; h.dm[ns][k] = v end
  function dyn:get(ns) return h.dm[ns] end
  local info = {}
  function info:dynamicMetadata() return dyn end
  function h:streamInfo() return info end
  function h:respond(hs, b) h.responded = {hs[":status"], b} end
  function h:bodyChunks()  -- the response's body: two chunks, counted as they are read
    return function()
      if h.chunks >= 2 then return nil end
      h.chunks = h.chunks + 1
      return h.chunks
    end
  end
  return h
end
"""

# the script's locals, reachable by the test (appended to the chunk, so in their scope)
_HOOK = (
    "\n_G.inferway_test = {pick = pick, refresh = refresh, eps = function() return eps end,"
    " holders = function() return holders end, record = record, matches = matches,"
    " keep = function(n) local old = KEEP; KEEP = n; return old end}\n"
)


@dataclass
class Picked:
    status: int
    """200: picked (``destination`` set); 429: shed (answered by the filter); 0: no pick."""
    destination: list[str]
    meta: dict[str, Any] = field(default_factory=dict)
    ticket: int | None = None
    _handle: Any = None


def chat_body(messages: Sequence[tuple[str, str]], model: str = "m") -> str:
    return json.dumps(
        {"model": model, "messages": [{"role": r, "content": c} for r, c in messages]}
    )


class LuaPicker:
    def __init__(self, picker: PickerIR, *, replace: Mapping[str, str] | None = None) -> None:
        self.lua = LuaRuntime(unpack_returned_tuples=True)
        self.now = 1000
        self.lua.globals().os.time = lambda: self.now
        script = score_script(picker)
        for old, new in (replace or {}).items():
            assert old in script, old
            script = script.replace(old, new)
        self.lua.execute(script + _HOOK)
        self._handle = self.lua.execute(_HANDLE)
        self.picker = picker
        self._meta: Any = None
        self.set_replicas(picker.replicas)

    def set_replicas(self, replicas: Sequence[ReplicaLoadIR]) -> int:
        """The route's metadata as the translator writes it; returns its version."""
        from dataclasses import replace

        self.picker = replace(self.picker, replicas=tuple(replicas))
        content = dict(load_metadata(self.picker))
        converted = {
            k: v if isinstance(v, float) else self.lua.table_from(list(v))
            for k, v in content.items()
        }
        self._meta = self.lua.table_from(converted)
        # as Envoy's next request would: the worker reads a changed version at once
        self.lua.globals().inferway_test.refresh(
            self._handle(None, self.lua.table_from({}), self._meta)
        )
        return int(content["v"])

    def request(self, body: str | None, headers: Mapping[str, str] | None = None) -> Picked:
        handle = self._handle(body, self.lua.table_from(dict(headers or {})), self._meta)
        self.lua.globals().envoy_on_request(handle)
        responded = handle.responded
        meta_table = handle.dm["inferway.picker"]
        meta = dict(meta_table) if meta_table is not None else {}
        found = re.search(r"prefix (\d+)/(\d+) blocks", str(meta.get("reason", "")))
        if found:
            meta["hit"], meta["blocks"] = int(found[1]), int(found[2])
        if responded is not None:
            return Picked(int(responded[1]), [], meta, None, handle)
        value = handle.hdrs["x-gateway-destination-endpoint"]
        if value is None:
            return Picked(0, [], meta, None, handle)
        ticket = handle.dm["inferway.picker.ticket"]["t"]
        return Picked(200, str(value).split(","), meta, int(ticket), handle)

    def finish(self, picked: Picked, content_type: str = "application/json") -> int:
        """The answer (its headers, and a stream's body to its end) on a response handle
        sharing the pick's dynamic metadata; returns the body chunks the filter read."""
        headers = self.lua.table_from({"content-type": content_type})
        response = self._handle(None, headers, self._meta, picked._handle.dm)
        self.lua.globals().envoy_on_response(response)
        return int(response.chunks)

    def rows(self, lora: str | None = None) -> dict[str, float]:
        """Endpoint -> total of every candidate, for a request without blocks (the test's hook
        on ``pick``, keeping all candidates; nothing is recorded)."""
        hook = self.lua.globals().inferway_test
        kept = hook.keep(1 << 20)
        try:
            result = hook.pick(self.lua.table_from([]), lora, None)
        finally:
            hook.keep(kept)
        status, rows = result[0], result[1]
        if status != 200:
            return {}
        return {str(row[3]["name"]): float(row[1]) for row in rows.values()}

    def state(self, endpoint: str) -> dict[str, float]:
        s = self.lua.globals().inferway_test.eps()[endpoint]
        return {k: s[k] for k in ("in_flight", "since", "done_since", "epoch")}

    def record(self, endpoint: str, blocks: Sequence[int]) -> None:
        """The index only: ``endpoint`` was sent ``blocks``."""
        hook = self.lua.globals().inferway_test
        hook.record(hook.eps()[endpoint], self.lua.table_from(list(blocks)))

    def matches(self, blocks: Sequence[int]) -> dict[str, int]:
        """The index only: per endpoint holding the first block, how many leading blocks."""
        found = self.lua.globals().inferway_test.matches(self.lua.table_from(list(blocks)))
        return {str(k): int(v) for k, v in found.items()}

    def blocks_held(self) -> int:
        held = self.lua.globals().inferway_test.holders()
        return sum(len(list(h.values())) for h in held.values())

    def memory_kib(self) -> float:
        self.lua.execute("collectgarbage('collect')")
        return float(self.lua.eval("collectgarbage('count')"))
