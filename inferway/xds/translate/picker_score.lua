-- inferway's scoring picker run in Envoy (picker: {process: envoy, pick: score}).
-- picker_score.py writes the settings above this line and explains the design; the pick is
-- the one gateway/picker/core/picker.py makes, per Envoy worker thread (each has its own Lua
-- state: this file's locals are that worker's prefix index, in-flight counts and sessions).

local tobit, bxor, lshift, rshift, rol = bit.tobit, bit.bxor, bit.lshift, bit.rshift, bit.rol
local byte, find, match, format, concat = string.byte, string.find, string.match, string.format, table.concat
local floor, now_s = math.floor, os.time

local HEADER = "x-gateway-destination-endpoint"
local W_SUM = W_QUEUE + W_KV + W_PREFIX + W_LORA + W_SESSION
if W_SUM <= 0 then W_SUM = 1 end

-- the pool, as the route's metadata last said (its "v" changes whenever anything in it does)
local version = nil
local pool = {}        -- endpoint names, in the metadata's order
local eps = {}         -- name -> its state
-- the prefix index: block hash -> {endpoint name -> true}; each endpoint's blocks in an LRU
-- list (newer/older links by block; a block sent again moves to the front)
local holders = {}
-- requests picked and not yet finished: ticket -> {state, epoch, started}; FIFO for expiry
local tickets = {}
local order, head, tail = {}, 1, 0
local next_ticket = 0
-- sessions: two generations, the older dropped when the newer fills (a bound, roughly LRU)
local sessions, old_sessions, n_sessions = {}, {}, 0

local function name_hash(s)
  local h = tobit(2166136261)
  for i = 1, #s do
    h = bxor(h, byte(s, i))
    h = tobit(lshift(h, 24) + h * 403)
  end
  return h
end

local function split_set(s)
  local set, n = {}, 0
  if s ~= nil and s ~= "" then
    for item in string.gmatch(s, "[^,]+") do set[item] = true; n = n + 1 end
  end
  return set, n
end

local function drop(block, name)
  local held = holders[block]
  if held ~= nil then
    held[name] = nil
    if next(held) == nil then holders[block] = nil end
  end
end

local function forget_blocks(state)
  for block in pairs(state.older) do drop(block, state.name) end
  state.newer, state.older, state.newest, state.oldest, state.n_blocks = {}, {}, nil, nil, 0
end

local function refresh(handle)
  local meta = handle:metadata()
  local v = meta:get("v")
  if v == nil or v == version then return end
  version = v
  local names = meta:get("e") or {}
  local depth, kv = meta:get("d") or {}, meta:get("k") or {}
  local running, waiting, max_lora = meta:get("r") or {}, meta:get("w") or {}, meta:get("m") or {}
  local wanted = {}
  pool = {}
  for i, name in ipairs(names) do
    wanted[name] = true
    pool[i] = name
    local state = eps[name]
    if state == nil then
      state = {name = name, hash = name_hash(name), in_flight = 0, since = 0, done_since = 0,
               epoch = 0, newer = {}, older = {}, n_blocks = 0}
      eps[name] = state
    end
    local d, k, m = depth[i], kv[i], max_lora[i]
    state.scraped = (d ~= nil and d >= 0) and d or nil
    state.kv = (k ~= nil and k >= 0) and k or nil
    state.max_lora = (m ~= nil and m >= 0) and m or nil
    local run, n_loaded = split_set(running[i])
    local wait = split_set(waiting[i])
    for lora in pairs(wait) do
      if not run[lora] then n_loaded = n_loaded + 1 end
    end
    state.loras_running, state.loras_waiting, state.n_loaded = run, wait, n_loaded
    -- a fresh scrape sees what was picked before it: the counts since restart
    state.since, state.done_since, state.epoch = 0, 0, state.epoch + 1
  end
  for name, state in pairs(eps) do
    if not wanted[name] then
      forget_blocks(state)
      eps[name] = nil
    end
  end
end

local function depth_of(state)
  if state.scraped == nil then return state.in_flight end
  local counted = state.scraped - state.done_since
  if counted < 0 then counted = 0 end
  counted = counted + state.since
  if state.in_flight > counted then return state.in_flight end
  return counted
end

local function kv_of(state, depth)
  local used, scraped = state.kv, state.scraped
  if used == nil or scraped == nil or scraped <= 0 then return used end
  used = used + (depth - scraped) * used / scraped
  if used < 0 then return 0 end
  if used > 1 then return 1 end
  return used
end

local function lora_score(state, lora)
  if lora == nil then return 1 end
  if state.loras_running[lora] then return 1 end
  if state.loras_waiting[lora] then return 0.8 end
  if state.max_lora == nil or state.n_loaded < state.max_lora then return 0.5 end
  return 0
end

-- the prompt's blocks: a running hash over the body from the messages/prompt on, four bytes
-- a step, its value at the end of each whole block (so a block matches only with everything
-- before it, as a server's KV cache does)
local function start_of_prompt(s)
  local at = find(s, '"messages"', 1, true)
  if at ~= nil then
    local _, stop = find(s, '^"messages"%s*:%s*%[', at)
    if stop ~= nil then return stop end
  end
  at = find(s, '"prompt"', 1, true)
  if at ~= nil then
    local _, stop = find(s, '^"prompt"%s*:', at)
    return stop
  end
  return nil
end

local function prompt_blocks(s, n)
  local at = start_of_prompt(s)
  if at == nil or at > SCAN_BYTES then return {} end
  local whole = floor((n - at) / BLOCK_BYTES)
  if whole > MAX_BLOCKS then whole = MAX_BLOCKS end
  local blocks = {}
  local h = tobit(2166136261)
  local i = at + 1
  for b = 1, whole do
    for j = i, i + BLOCK_BYTES - 4, 4 do
      local w1, w2, w3, w4 = byte(s, j, j + 3)
      h = bxor(h, w1 + lshift(w2, 8) + lshift(w3, 16) + lshift(w4, 24))
      h = tobit(rol(h, 13) * 5 + 1801774052)
    end
    i = i + BLOCK_BYTES
    blocks[b] = h
  end
  return blocks
end

local function model_of(s)
  local at = find(s, '"model"', 1, true)
  if at == nil then return nil end
  return match(s, '^"model"%s*:%s*"([^"]*)"', at)
end

-- LRU links: older[b] is the block sent before b (false: none), newer[b] the one after
local function unlink(state, block)
  local before, after = state.older[block], state.newer[block]
  if before then state.newer[before] = after else state.oldest = after or nil end
  if after then state.older[after] = before else state.newest = before or nil end
  state.older[block], state.newer[block] = nil, nil
end

local function record(state, blocks)
  local name, older, newer = state.name, state.older, state.newer
  for b = 1, #blocks do
    local block = blocks[b]
    if older[block] ~= nil then
      if state.newest ~= block then
        unlink(state, block)
        state.n_blocks = state.n_blocks - 1
      else
        block = nil  -- already the newest
      end
    end
    if block ~= nil then
      local newest = state.newest
      older[block], newer[block] = newest or false, false
      if newest then newer[newest] = block else state.oldest = block end
      state.newest = block
      state.n_blocks = state.n_blocks + 1
      local held = holders[block]
      if held == nil then held = {}; holders[block] = held end
      held[name] = true
      if state.n_blocks > BLOCKS_PER_ENDPOINT then
        local oldest = state.oldest
        unlink(state, oldest)
        state.n_blocks = state.n_blocks - 1
        drop(oldest, name)
      end
    end
  end
end

local function matches(blocks)
  local matched = {}
  for b = 1, #blocks do
    local held = holders[blocks[b]]
    if held == nil then break end
    for name in pairs(held) do matched[name] = b end
  end
  return matched
end

local function finish(ticket)
  local t = tickets[ticket]
  if t == nil then return end
  tickets[ticket] = nil
  local state = t[1]
  if state.in_flight > 0 then state.in_flight = state.in_flight - 1 end
  if state.epoch == t[2] then
    if state.since > 0 then state.since = state.since - 1 end
  else
    state.done_since = state.done_since + 1
  end
end

local function expire(now)
  while head <= tail do
    local ticket = order[head]
    local t = tickets[ticket]
    if t ~= nil and now - t[3] < IN_FLIGHT_EXPIRY_S then return end
    if t ~= nil then finish(ticket) end
    order[head] = nil
    head = head + 1
  end
end

local function remember_session(session, name)
  if sessions[session] == nil then
    n_sessions = n_sessions + 1
    if n_sessions > MAX_SESSIONS then
      old_sessions, sessions, n_sessions = sessions, {}, 1
    end
  end
  sessions[session] = name
end

-- the prompt's own order of the replicas (a hash of its first block and the replica's name):
-- the same in every worker and every Envoy
local function order_of(state, first)
  local rank = bxor(state.hash, first)
  rank = tobit(lshift(rank, 24) + rank * 403)
  return bxor(rank, rshift(rank, 15))
end


-- one candidate's weighted total and its five scores, in SCORERS order
local function score(state, p, lora, sticky)
  local q = 1 / (1 + state.depth / QUEUE_LIMIT)
  local k = 0.5
  local used = state.used
  if used ~= nil then k = 1 - used; if k < 0 then k = 0 elseif k > 1 then k = 1 end end
  local l = lora_score(state, lora)
  local s = (state.name == sticky) and 1 or 0
  local total = (W_QUEUE * q + W_KV * k + W_PREFIX * p + W_LORA * l + W_SESSION * s) / W_SUM
  return total, q, k, l, s
end

local function sticky_of(session)
  if session == nil then return nil end
  return sessions[session] or old_sessions[session]
end

local KEEP = FALLBACKS + 1
if KEEP < 2 then KEEP = 2 end  -- the runner-up is in every reason

-- one pick: nil when there is nothing to choose from; else status (200 or 429), the best
-- KEEP candidates best first ({total, tie, state, prefix score, hit, home}), the number
-- saturated, all saturated. Each candidate's depth and KV use are left on its state.
local function pick(blocks, lora, session)
  local n_pool = #pool
  if n_pool == 0 then return nil end
  local open = {}
  for i = 1, n_pool do
    local state = eps[pool[i]]
    local depth = depth_of(state)
    local used = kv_of(state, depth)
    state.depth, state.used = depth, used
    if depth < QUEUE_LIMIT and (used == nil or used < KV_CACHE_LIMIT) then
      open[#open + 1] = state
    end
  end
  local saturated = n_pool - #open
  if #open == 0 then
    if SHED then return 429, nil, saturated, true end
    for i = 1, n_pool do open[i] = eps[pool[i]] end
  end
  local n_open = #open
  local n_blocks = #blocks
  local matched = n_blocks > 0 and matches(blocks) or {}
  local matched_any = false  -- an open candidate holds part of the prompt (here)
  for i = 1, n_open do
    if matched[open[i].name] ~= nil then matched_any = true; break end
  end
  local sticky = sticky_of(session)
  local first = blocks[1] or 0
  -- a prompt no open candidate holds here (new to this worker, or its holders saturated)
  -- goes to its home: the first replica in the prompt's own order (a hash of its first block)
  -- with room (a depth at most HOME_LOAD_BOUND times the least loaded's, plus one), scored as
  -- if it held the prefix. Workers and Envoys that see the pool alike put the prompt there,
  -- and spill it to the same next one, so it is cached once; the room keeps new prompts on
  -- the least loaded replicas (a unique prompt is one too)
  local home = nil
  if n_blocks > 0 and HOME_LOAD_BOUND > 0 and matched_any == false then
    local least = open[1].depth
    for i = 2, n_open do
      if open[i].depth < least then least = open[i].depth end
    end
    local room = least * HOME_LOAD_BOUND + 1
    local best = nil
    for i = 1, n_open do
      local state = open[i]
      if state.depth < room then
        local rank = order_of(state, first)
        if best == nil or rank > best then best, home = rank, state end
      end
    end
  end
  -- the best KEEP, by total then the prompt's own order (equal totals: the same choice in
  -- every worker); one pass, no table per candidate
  local rows, n_rows = {}, 0
  for i = 1, n_open do
    local state = open[i]
    local hit = matched[state.name] or 0
    local p = n_blocks > 0 and hit / n_blocks or 0
    if state == home then p = 1 end
    local total = score(state, p, lora, sticky)
    local last = rows[n_rows]
    local tie = nil
    if n_rows == KEEP and total == last[1] then tie = order_of(state, first) end
    if n_rows < KEEP or total > last[1] or (tie ~= nil and tie > last[2]) then
      tie = tie or order_of(state, first)
      local row = {total, tie, state, p, hit, state == home}
      local at = n_rows < KEEP and n_rows + 1 or KEEP
      if n_rows < KEEP then n_rows = n_rows + 1 end
      while at > 1 and (rows[at - 1][1] < total or (rows[at - 1][1] == total and rows[at - 1][2] < tie)) do
        rows[at] = rows[at - 1]
        at = at - 1
      end
      rows[at] = row
    end
  end
  return 200, rows, saturated, saturated == n_pool
end

local NAMES = {"queue", "kv_cache", "prefix", "lora", "session"}
local WEIGHTS = {W_QUEUE, W_KV, W_PREFIX, W_LORA, W_SESSION}

local function reason(rows, saturated, all_saturated, n_blocks, lora, sticky)
  local first = rows[1]
  local state = first[3]
  local total, q, k, l, sc = score(state, first[4], lora, sticky)
  local scores = {q, k, first[4], l, sc}
  local parts = {}
  for i = 1, 5 do
    if WEIGHTS[i] > 0 then parts[#parts + 1] = format("%s %.2fx%g", NAMES[i], scores[i], WEIGHTS[i]) end
  end
  local held = format("prefix %d/%d blocks%s", first[5], n_blocks, first[6] and ", new here: its home" or "")
  local text = format("%s total %.3f (%s; depth %g; %s)", state.name, total,
    concat(parts, ", "), state.depth, held)
  if rows[2] ~= nil then text = text .. format("; runner-up %s %.3f", rows[2][3].name, rows[2][1]) end
  if saturated > 0 then
    text = text .. format("; %d saturated %s", saturated, all_saturated and "(all: least bad)" or "excluded")
  end
  return text
end

function envoy_on_request(handle)
  local headers = handle:headers()
  headers:remove(HEADER)  -- the client's own never steers
  refresh(handle)
  if #pool == 0 then return end  -- nothing known: the service's own balancing
  local blocks, lora = {}, nil
  local body = handle:body()  -- waits for the whole body: headers taken before are stale
  headers = handle:headers()
  if body ~= nil then
    local n = body:length()
    if n > SCAN_BYTES + BLOCK_BYTES * MAX_BLOCKS then n = SCAN_BYTES + BLOCK_BYTES * MAX_BLOCKS end
    if n > 0 then
      local s = body:getBytes(0, n)
      blocks = prompt_blocks(s, n)
      lora = model_of(s)
    end
  end
  local session = SESSION_HEADER ~= "" and headers:get(SESSION_HEADER) or nil
  local now = now_s()
  expire(now)
  local status, rows, saturated, all_saturated = pick(blocks, lora, session)
  local meta = handle:streamInfo():dynamicMetadata()
  if status == 429 then
    meta:set(NAMESPACE, "reason", format("all %d endpoints saturated: shed", saturated))
    handle:respond({[":status"] = "429", ["content-type"] = "application/json"},
      format('{"error":{"message":"all %d replicas are saturated","type":"overloaded"}}', saturated))
    return
  end
  local why = reason(rows, saturated, all_saturated, #blocks, lora, sticky_of(session))
  local winner = rows[1][3]
  local chosen = {winner.name}
  for i = 2, 1 + FALLBACKS do
    if rows[i] == nil then break end
    chosen[i] = rows[i][3].name
  end
  headers:replace(HEADER, concat(chosen, ","))
  winner.in_flight = winner.in_flight + 1
  winner.since = winner.since + 1
  if #blocks > 0 then record(winner, blocks) end
  if session ~= nil then remember_session(session, winner.name) end
  next_ticket = next_ticket + 1
  tickets[next_ticket] = {winner, winner.epoch, now}
  tail = tail + 1
  order[tail] = next_ticket
  meta:set(TICKETS, "t", next_ticket)
  meta:set(NAMESPACE, "winner", winner.name)
  meta:set(NAMESPACE, "reason", why)
end

function envoy_on_response(handle)
  local mine = handle:streamInfo():dynamicMetadata():get(TICKETS)
  if mine == nil then return end
  local ticket = mine.t
  -- in flight until its last byte: a stream's (server-sent events) is read to its end; any
  -- other answer is whole once its headers come (an LLM server answers after generating)
  local kind = handle:headers():get("content-type")
  if kind ~= nil and find(kind, "text/event-stream", 1, true) then
    for _ in handle:bodyChunks() do end
  end
  finish(ticket)
end
