r"""The Lua scripts of the Redis feature store: users' sequences and items' first-seen times.

Each script call carries many users (or items) and runs atomically; the store packs its
arguments and parses its replies (``redis_codec``).
"""

# KEYS: seq, ids of each user of the call, in turn. ARGV: cap, ttl_ms, horizon_ms, Redis's
# compact sorted-set limits (entries, member bytes: see ``redis_server.compact_limits``), then one
# string per user holding its events, one line each (see ``redis_codec.event_line``):
# ``ts \x1f want \x1f member \x1f mark \n``, want 1 when a history is asked for (2 and 3 as
# 0 and 1 for an event judged by its id but not stored, an impression). One string
# per user, not four arguments per event: packing arguments cost redis-py more than Lua's
# one pattern match per line costs Redis.
# Returns one flat list, one string per event in call order: ``0`` and, when asked for, its
# history (accepted; the latest `cap` entries strictly before its time, newest first, members
# and scores joined by tabs), ``3`` (accepted, and its history is that of the user's event
# read before it, at the same time), or ``1`` (duplicate) / ``2`` (conflict) and what the id
# holds.
# Per user, trims the sequence to the latest `cap` entries before the batch's earliest
# accepted event, keeping everything from it on, so a batch redone after an aborted commit
# reads exactly the same histories. A batch can so push the sequence past Redis's compact
# limit (128 entries) before the trim: Redis makes it a skiplist (about three times the bytes)
# and never turns it back, so once the trim brings it within the limit again the sequence is
# written afresh, compact. Only a call that may have passed the limit (the entries before the
# batch and the batch's own exceed it, or the batch reaches back before the newest stored
# entry: late events, a redo) counts the sequence: none of a user's usual calls.
# An id is remembered as ``mark \t ts``. It counts as forgotten once it is older than the
# horizon behind the user's newest event before the call (the newest entry of the sequence,
# which trimming never removes), as if it had been deleted then; it is deleted for real when
# the newest event crosses a multiple of the horizon, so an id stays in Redis at most two
# horizons. Commands are what Redis spends its time on (about a microsecond each), so they
# are saved where the answer is known: HSETNX judges a new id in one command, no sorted set
# of ids to keep in step, and the count before the earliest event is that event's history
# when it is short. Constant arguments go to redis.call as strings: a Lua number is printed
# first (a printf each: 6% of Redis's instructions in the benchmark). Expiry times are
# absolute (PEXPIREAT here, SET ... PXAT for items, from the script's TIME): Redis rewrites a
# relative PEXPIRE or PX into the absolute form for propagation, and the rewrite was 3% of
# its instructions in the benchmark (``bench/redis_instructions.py``).
SEQUENCE_LUA = """
local cap, ttl, horizon = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local entries, value = tonumber(ARGV[4]), tonumber(ARGV[5])
local quarter = math.max(1, math.floor(tonumber(ttl) / 4))
local now = redis.call('TIME')
local expires = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ttl))
-- a sequence Redis turned into a skiplist (it passed `entries` in this call: it held `removed`
-- more before the trim, or the call began past them) written afresh, compact, once it fits
-- again: Redis never turns one back by itself
local function compact(seq, ids, removed)
  local size = redis.call('ZCARD', seq)
  if size > entries or size + removed <= entries then return end  -- still past, or never was
  local all, args = redis.call('ZRANGE', seq, '0', '-1', 'WITHSCORES'), {}
  for i = 1, #all, 2 do
    if #all[i] > value then return end  -- too long a member for the compact form
    args[i], args[i + 1] = all[i + 1], all[i]
  end
  redis.call('DEL', seq)
  redis.call('ZADD', seq, unpack(args))
  redis.call('PEXPIREAT', seq, expires)
  redis.call('PEXPIREAT', ids, expires)
end
local out = {}
for u = 1, #ARGV - 5 do
  local seq, ids = KEYS[2 * u - 1], KEYS[2 * u]
  local top = redis.call('ZREVRANGE', seq, '0', '0', 'WITHSCORES')
  local newest = tonumber(top[2])  -- nil for a user without a sequence
  local chunk, added, reads, low, lowscore, high = {}, {}, {}, nil, nil, newest
  for score, want, member, id, mark in
      string.gmatch(ARGV[u + 5], '(%-?%d+)\\31(%d)\\31(([^\\t]*)[^\\31]*)\\31([^\\n]*)\\n') do
    local code, seen, value = 0, nil, mark .. '\\t' .. score
    if redis.call('HSETNX', ids, id, value) == 0 then
      seen = redis.call('HGET', ids, id)
      -- a bare mark was written before ids kept their time: the same record too
      if seen ~= value and seen ~= mark then
        local at = tonumber(string.match(seen, '\\t(%-?%d+)$'))
        if at ~= nil and newest ~= nil and at < newest - horizon and not added[id] then
          redis.call('HSET', ids, id, value)  -- forgotten: a new id again
        elseif string.match(seen, '^[^\\t]*') == string.match(mark, '^[^\\t]*') then
          code = 1
        else
          code = 2
        end
      end
    end
    if code == 0 then
      added[id] = true
      local n = tonumber(score)
      if low == nil or n < low then low, lowscore = n, score end
      if high == nil or n > high then high = n end
      if want < '2' then  -- 2 and 3: judged, not stored
        chunk[#chunk + 1] = score
        chunk[#chunk + 1] = member
      end
      if want == '1' or want == '3' then  -- its history is read once the batch is in
        reads[#reads + 1] = #out + 1
        out[#out + 1] = score
      else
        out[#out + 1] = '0'
      end
    else
      out[#out + 1] = code .. seen
    end
  end
  for i = 1, #chunk, 1000 do  -- unpack() has a small stack: add in slices
    redis.call('ZADD', seq, unpack(chunk, i, math.min(i + 999, #chunk)))
  end
  -- entries stored strictly before low, once known: none for a new user (only this call's
  -- events are stored), or as a history read at low tells
  local before = nil
  if newest == nil then before = 0 end
  local last = nil  -- the time of the read before: events at one time share their history
  for _, at in ipairs(reads) do
    local score = out[at]
    if before == 0 and tonumber(score) <= low then
      out[at] = '0'  -- nothing is stored before it: no read
    elseif score == last then
      out[at] = '3'  -- the history of the read before (a page of impressions, say)
    else
      local history = redis.call('ZREVRANGEBYSCORE', seq, '(' .. score, '-inf', 'WITHSCORES', 'LIMIT', '0',
        ARGV[1])
      if score == lowscore and #history < 2 * cap then before = #history / 2 end
      out[at] = '0' .. table.concat(history, '\\t')
    end
    last = score
  end
  if low ~= nil then
    if before == nil then before = redis.call('ZCOUNT', seq, '-inf', '(' .. lowscore) end
    local removed = 0
    if before > cap then
      removed = before - cap
      redis.call('ZREMRANGEBYRANK', seq, 0, removed - 1)
    end
    -- it may have passed `entries`: more than that before and in the batch, or entries from
    -- `low` on stored before (a late event, a redo) that `before` does not count
    if before + #chunk / 2 > entries or (newest ~= nil and low <= newest) then compact(seq, ids, removed) end
    if newest ~= nil and horizon > 0 and math.floor(high / horizon) > math.floor(newest / horizon) then
      local all, old = redis.call('HGETALL', ids), {}
      for i = 1, #all, 2 do
        local at = tonumber(string.match(all[i + 1], '\\t(%-?%d+)$'))
        if at ~= nil and at < high - horizon then old[#old + 1] = all[i] end
      end
      for i = 1, #old, 1000 do
        redis.call('HDEL', ids, unpack(old, i, math.min(i + 999, #old)))
      end
    end
  end
  -- a new user's keys get the TTL, refreshed when the user's newest event time enters a new
  -- quarter of it: two commands a user per quarter TTL, not per batch
  if newest == nil or (high ~= nil and math.floor(high / quarter) > math.floor(newest / quarter)) then
    redis.call('PEXPIREAT', seq, expires)
    redis.call('PEXPIREAT', ids, expires)
  end
end
return out
"""
# KEYS: item keys. ARGV: ttl_ms, then one time per key. Keeps the earliest time each item was
# seen, so it does not depend on the order events arrive in (a late event, a rebuild);
# returns the recorded times. A new item, most of them, costs one command.
FIRST_SEEN_LUA = """
local out = {}
local now = redis.call('TIME')
local expires = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1]))
for i = 1, #KEYS do
  local ts = ARGV[i + 1]
  local seen = ts
  if not redis.call('SET', KEYS[i], ts, 'NX', 'PXAT', expires) then
    seen = redis.call('GET', KEYS[i])
    if tonumber(ts) < tonumber(seen) then
      redis.call('SET', KEYS[i], ts, 'PXAT', expires)
      seen = ts
    end
  end
  out[i] = seen
end
return out
"""
