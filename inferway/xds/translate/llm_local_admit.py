"""Admission inside Envoy (``llm.transport: http`` without token limits): the Lua filter reads
a plain request body itself, routes it and rewrites it, and only tells the LLM processor,
without waiting, so no Python runs before the request goes upstream.

The script finds the body's top-level ``model``, ``stream`` and ``stream_options`` with a
small JSON scanner (strings, nesting and literals checked; the first ``{`` to its matching
``}``). It admits the request when the body is an object whose ``model`` is a plain string
(no escapes) naming a model the policy serves, and ``stream_options``, if the gateway has to
add ``include_usage``, is absent. Then, as the processor would: the alias replaced by the
served name, ``"stream_options":{"include_usage":true}`` inserted when the client did not
ask for usage (the answer's usage chunk is then dropped), the ``inferway.llm`` metadata set,
the route cache cleared; and one asynchronous ``POST /inferway/llm/notice`` on the reports
cluster tells the processor (the stream's id, the client key, the models, when it started),
which registers the stream as ``admit`` does. Anything else (a repeated or escaped key, a
model not served, a ``stream_options`` to merge, a body that is not plain JSON) goes to the
processor as before, which names the problem in its answer.

With token limits the processor must see each request before it goes upstream: no local
admission then.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

__all__ = ["NOTICE_PATH", "local_admit_source", "lua_models", "lua_string"]

NOTICE_PATH = "/inferway/llm/notice"
"""Where the script tells the processor of a request it admitted (no answer awaited)."""


def lua_string(value: str) -> str:
    """A Lua string literal of ``value`` (every byte outside a few safe ones as ``\\ddd``)."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_./:"
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03d}" for b in value.encode()) + '"'


def lua_models(models: Mapping[str, str], asking: Collection[str]) -> str:
    """The ``MODELS`` table: every name and alias -> the served name, its JSON form (what
    replaces an alias in the body) and whether its streams get ``include_usage``."""
    entries = [
        f"[{lua_string(name)}] = {{name = {lua_string(served)}, "
        f"json = {lua_string(json.dumps(served))}, ask = {str(served in asking).lower()}}}"
        for name, served in sorted(models.items())
    ]
    return ",\n  ".join(entries)


def local_admit_source(models: Mapping[str, str] | None, asking: Collection[str]) -> str:
    """The Lua of local admission, with ``models`` (every name and alias -> the served name;
    None: never admit here) and the ``asking`` models' streams getting ``include_usage``."""
    return (
        _LUA.replace("@LOCAL@", "false" if models is None else "true")
        .replace("@NOTICE@", NOTICE_PATH)
        .replace("@MODELS@", lua_models(models or {}, asking))
    )


_LUA = r"""
local LOCAL = @LOCAL@
local NOTICE = "@NOTICE@"
local MODELS = {
  @MODELS@
}
local CLOSE = {[123] = 125, [91] = 93}
local SEQ = 0
local WORKER = string.match(tostring({}), "0x(%x+)") or "0"

local ESCAPES = {[34] = true, [92] = true, [47] = true, [98] = true, [102] = true,
  [110] = true, [114] = true, [116] = true, [117] = true}

-- the quote that ends the string opened at i (nil: unterminated, a raw control character,
-- an escape JSON does not have, a \u without its four hex digits)
local function string_end(s, i)
  local j = i + 1
  while true do
    local k = string.find(s, '["\\%c]', j)
    if k == nil then return nil end
    local b = string.byte(s, k)
    if b == 34 then return k end
    local e = string.byte(s, k + 1)
    if b ~= 92 or not ESCAPES[e] then return nil end
    j = k + 2
    if e == 117 then  -- \u: four hex digits
      if string.find(s, "^%x%x%x%x", j) == nil then return nil end
      j = j + 4
    end
  end
end

-- the last character of the value that starts at i (nil: not a value)
local function value_end(s, i)
  local c = string.byte(s, i)
  if c == 34 then return string_end(s, i) end
  if CLOSE[c] ~= nil then
    local expected, depth, j = {CLOSE[c]}, 1, i + 1
    while true do
      local k = string.find(s, '[%[%]{}"]', j)
      if k == nil then return nil end
      local b = string.byte(s, k)
      if b == 34 then
        k = string_end(s, k)
        if k == nil then return nil end
      elseif CLOSE[b] ~= nil then
        depth = depth + 1
        expected[depth] = CLOSE[b]
      else
        if expected[depth] ~= b then return nil end
        depth = depth - 1
        if depth == 0 then return k end
      end
      j = k + 1
    end
  end
  local k = (string.find(s, '[,}%]%s]', i) or (#s + 1)) - 1
  local literal = string.sub(s, i, k)
  if literal == "true" or literal == "false" or literal == "null"
      or string.find(literal, "^%-?%d+%.?%d*[eE]?[%+%-]?%d*$") then
    return k
  end
  return nil
end

-- the spans of the body's top-level model, stream and stream_options ({first, last} of each
-- value); nil for a body the processor should judge
local WANTED = {model = true, stream = true, stream_options = true}
local function members(s)
  local i = string.find(s, "%S")
  if i == nil or string.byte(s, i) ~= 123 then return nil end
  local found = {}
  i = string.find(s, "%S", i + 1)
  while i ~= nil do
    if string.byte(s, i) ~= 34 then return nil end
    local e = string_end(s, i)
    if e == nil then return nil end
    local key = string.sub(s, i + 1, e - 1)
    if string.find(key, "\\", 1, true) then return nil end
    i = string.find(s, "%S", e + 1)
    if i == nil or string.byte(s, i) ~= 58 then return nil end
    i = string.find(s, "%S", i + 1)
    if i == nil then return nil end
    local last = value_end(s, i)
    if last == nil then return nil end
    if WANTED[key] then
      if found[key] ~= nil then return nil end
      found[key] = {i, last}
    end
    i = string.find(s, "%S", last + 1)
    if i == nil then return nil end
    local b = string.byte(s, i)
    if b == 125 then
      if string.find(s, "%S", i + 1) then return nil end
      return found
    end
    if b ~= 44 then return nil end
    i = string.find(s, "%S", i + 1)
  end
  return nil
end

local function quote(s)
  return (string.gsub(s, "[^%w%-%._~]", function(c)
    return string.format("%%%02X", string.byte(c)) end))
end

-- admits the request here when its body is plain; false: ask the processor
local function admit_here(handle, call)
  if not LOCAL then return false end
  local body = handle:body()
  if body == nil or body:length() == 0 then return false end
  local size = body:length()
  local s = body:getBytes(0, size)
  local found = members(s)
  if found == nil or found.model == nil then return false end
  local m = found.model
  if string.byte(s, m[1]) ~= 34 then return false end
  local requested = string.sub(s, m[1] + 1, m[2] - 1)
  local served = MODELS[requested]
  if served == nil then return false end
  local stream = found.stream ~= nil and string.sub(s, found.stream[1], found.stream[2]) == "true"
  local wants = false
  if found.stream_options ~= nil then
    local options = string.sub(s, found.stream_options[1], found.stream_options[2])
    wants = string.find(options, '^{%s*"include_usage"%s*:%s*true%s*}$') ~= nil
    if stream and served.ask and not wants then return false end  -- to merge: the processor
  end
  local drop = stream and served.ask and not wants
  local out = s
  if served.name ~= requested then
    out = string.sub(s, 1, m[1] - 1) .. served.json .. string.sub(s, m[2] + 1)
  end
  if drop then
    local brace = string.find(out, "{", 1, true)
    out = string.sub(out, 1, brace) .. '"stream_options":{"include_usage":true},'
      .. string.sub(out, brace + 1)
  end
  SEQ = SEQ + 1
  local id = "e" .. WORKER .. "-" .. call["x-inferway-started"] .. "-" .. SEQ
  call[":path"] = NOTICE
  call["x-inferway-id"] = id
  call["x-inferway-requested"] = quote(requested)
  call["x-inferway-served"] = quote(served.name)
  call["x-inferway-stream"] = stream and "1" or "0"
  call["x-inferway-drop-usage"] = drop and "1" or "0"
  call["x-inferway-prompt-bytes"] = tostring(size)
  handle:httpCall(CLUSTER, call, "", ADMIT_TIMEOUT, true)
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set(NS, "model", served.name)
  meta:set(NS, "id", id)
  meta:set(NS, "drop_usage", drop)
  meta:set(NS, "open", true)
  local headers = handle:headers()
  if out ~= s then
    body:setBytes(out)
    headers:replace("content-length", tostring(#out))
  end
  for _, name in ipairs(SERVED_BY) do headers:remove(name) end
  handle:clearRouteCache()
  return true
end
"""
