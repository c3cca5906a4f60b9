-- Envoy's Lua filter on openai routes: admission (llm.transport http) and the answer's reader.
-- xds/translate/llm_stream.py fills its @NAME@ placeholders and explains it.
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
local NATIVE = @NATIVE@  -- inferway's SSE module reads the streams (after this filter)
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
  if NATIVE then
    -- the module counts each chunk before this filter sees it and writes the counts into
    -- the metadata at the answer's end: this script waits for that end, not for each chunk
    handle:trailers()
    local counted = handle:streamInfo():dynamicMetadata():get(NS) or {}
    t.chunks = counted["chunks"] or 0
    t.first, t.last = counted["first"], counted["last"]
    t.prompt, t.completion = counted["prompt"], counted["completion"]
    t.model, t.done = counted["model_answered"], counted["done"] == true
    report(handle, id, t, true)
    return
  end
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
