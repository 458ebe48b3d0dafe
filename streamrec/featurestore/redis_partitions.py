r"""The partition state of `streamrec.featurestore.partitions` in Redis: two Lua scripts.

Keys per partition, hash-tagged ``{<topic>:<partition>}`` so one script call holds them all
(on a Cluster, one slot per partition):

- ``<prefix>:part:{t:p}``: a hash: ``epoch``, ``newest`` and ``stamp`` (the newest event time
  and the last offset of the batch that set it), ``prev_newest``/``prev_stamp`` before it, and
  ``claimed``, the offset the last claim read it from;
- ``<prefix>:win:{t:p}``: a hash, ``user \t event_id`` -> the impression's window,
  ``opened \t clicked \t closed \t ts \t deadline \t item \t category \t history key``
  (the three stamps are offsets, -1 while unset);
- ``<prefix>:hist:{t:p}``: a hash, history key -> a history (the items joined by ``\x1d``,
  ``\x1c``, then the categories joined by ``\x1d``), shared by the impressions of one page
  (one user, one time): ``<prefix>:refs:{t:p}`` counts the windows holding each;
- ``<prefix>:pair:{t:p}``: a sorted set of ``user \t item \t event_id``, all scored 0: the
  windows of a user and item are one lexicographic range;
- ``<prefix>:due:{t:p}`` and ``<prefix>:done:{t:p}``: sorted sets of the open windows and
  of the closed ones, by deadline (a closed one is forgotten once the watermark passes its
  deadline + retention);
- ``<prefix>:jrn:{t:p}``: a set of the windows the last batch touched (what an undo visits);
- ``<prefix>:feat:{t:p}``: with declared features only, a hash, ``user \t event_id`` -> the
  impression's sample features (`Sample.features` as JSON: its target's behaviour values, its
  context, its user's as of its time), gone with its window; the history's behaviour values
  (`Sample.seq_features` as JSON) follow its categories in its history, after a ``\x1c``. The
  default schema's windows and histories are as they were, and no ``feat`` key is made.

Every key but ``part`` is refreshed to the store's TTL at each batch. ``part`` is kept for good
(one small hash a partition): it keeps the epoch and the watermark through any idle spell, and its
absence where the consumers' group committed an offset tells a partition whose state was lost
(`streamrec.featurestore.partitions`). A claim removes the TTL a store written by an earlier
version gave it.

Each script writes ``part`` in two commands, never one. Redis replicates a script as its write
commands, wrapped in MULTI/EXEC when there are several, and Redis 7.0 with an AOF and
``user default off`` drops every MULTI/EXEC when it replays its AOF after a restart (a
``NOPERM`` line each): the sequences and windows are lost, while a single write (an earlier
version's ``part`` once it had no TTL to refresh) survives. Written in two, ``part`` goes with
the rest, and the consumers see the partitions lost (checked by hand on Redis 7.0.15:
docs/operating/deployment.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from streamrec.featurestore.partitions import (
    Claim,
    Decision,
    Features,
    JoinInput,
    PartitionBatch,
    PartitionOutcome,
    SeqFeatures,
)
from streamrec.kafka.records import Partition

# KEYS: part. ARGV: the offset the partition is read from, '1' to start a partition without
# state ('0': leave it as it is). Returns the new epoch (0: none, nothing written), the newest
# event time as of that offset ('' if none), and 1 if the partition's state was there. The part
# hash is kept for good (PERSIST: a store written before this version gave it a TTL), so a
# partition without one after its group committed on it lost its state.
CLAIM_LUA = """
local found = redis.call('EXISTS', KEYS[1])
if found == 0 and ARGV[2] ~= '1' then return {0, '', 0} end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
local v = redis.call('HMGET', KEYS[1], 'newest', 'stamp', 'prev_newest')
local newest = v[1]
if v[2] and tonumber(v[2]) >= tonumber(ARGV[1]) then newest = v[3] end
redis.call('PERSIST', KEYS[1])
redis.call('HSET', KEYS[1], 'claimed', ARGV[1])  -- a second write: see the module docstring
return {epoch, newest or '', found}
"""

# KEYS: part, win, hist, refs, pair, due, done, jrn, feat. ARGV: epoch, first, last, newest ('' for none),
# allowed_ms ('' for no join: nothing closes), window_ms, retention_ms, ttl_ms, then the
# inputs, one line each:
# ``kind \x1f offset \x1f user \x1f event_id \x1f item \x1f category \x1f ts \x1f at
# \x1f features \x1f history \n`` with kind i (impression, ``at`` its window's deadline, ts + window_ms: Lua
# turns a 13-digit number into a string slowly), c (click) or l (late click, ``at`` the
# watermark it was judged late by); an impression's history ``\x1e`` is that of the impression before
# (a page's impressions share one). Returns a flat list: ``a<offset>`` for a click that took
# or hit an open window, ``<label> \t user \t event_id \t item \t category \t ts \t features
# \t history`` for each decision (features '' for none; ``\x1e``: the history of the decision
# before), and last the late labels
# counted. Histories (a kilobyte at 50 behaviours) live in their own hash, read only for a
# decision: the window's own value stays a few bytes, and closing and forgetting many windows
# at once are a handful of bulk commands.
ADVANCE_LUA = """
local part, win, hist, refs, pair, due, done, jrn, feat = unpack(KEYS)
local featured = redis.call('EXISTS', feat) == 1  -- windows keep declared features
local epoch = redis.call('HGET', part, 'epoch')
if epoch ~= ARGV[1] then
  return redis.error_reply('FENCED epoch ' .. tostring(epoch) .. ' of ' .. part .. ', ours ' .. ARGV[1])
end
local first, last = tonumber(ARGV[2]), tonumber(ARGV[3])
local retention = tonumber(ARGV[7])  -- ARGV[6], window_ms, is in each impression's deadline

local function parse(v)  -- opened, clicked, closed, ts, deadline, item, category, history key
  local o, c, x, ts, d, item, cat, hk = string.match(v,
    '^(%-?%d+)\\t(%-?%d+)\\t(%-?%d+)\\t(%-?%d+)\\t(%-?%d+)\\t([^\\t]*)\\t([^\\t]*)\\t(.*)$')
  return {tonumber(o), tonumber(c), tonumber(x), ts, tonumber(d), item, cat, hk}
end
-- the same as strings, where only a stamp changes: opened, clicked, ts, deadline, item,
-- category, history key; and a window's item and history key
local field, skip = '([^\\t]*)\\t', '[^\\t]*\\t'
local as_strings = '^' .. field .. field .. skip .. field .. field .. field .. field .. '(.*)$'
local item_and_history = '^' .. string.rep(skip, 5) .. field .. skip .. '(.*)$'
local function pack(w)
  return string.format('%d\\t%d\\t%d\\t', w[1], w[2], w[3]) .. w[4] .. '\\t' ..
    string.format('%d', w[5]) .. '\\t' .. w[6] .. '\\t' .. w[7] .. '\\t' .. w[8]
end
-- A page's impressions (one user, one time) share one history: it is kept once, under
-- ``user \\t ts``, with a count of the windows holding it; another history at the same time
-- (rare) goes under the window's own key and a tab.
local function release(hk)  -- a window gone: its history too, once no window holds it
  if redis.call('HINCRBY', refs, hk, -1) <= 0 then
    redis.call('HDEL', hist, hk)
    redis.call('HDEL', refs, hk)
  end
end
-- The page shared last and the windows it gained since, counted at once when another page
-- comes (a page's impressions come together).
local shared_hk, shared_history, pending = nil, nil, 0
local function settle()
  if pending > 0 then redis.call('HINCRBY', refs, shared_hk, pending) end
  pending = 0
end
local function share(user, ts, key, history)
  local hk = user .. '\\t' .. ts
  if hk == shared_hk and history == shared_history then
    pending = pending + 1
    return hk
  end
  settle()
  local held = redis.call('HGET', hist, hk)
  shared_hk, shared_history = hk, history
  if held == history then
    pending = 1
    return hk
  end
  if held then
    hk = key .. '\\t'
    shared_hk = nil
  end
  redis.call('HSET', hist, hk, history)
  redis.call('HSET', refs, hk, 1)
  return hk
end
local function unshare(hk)  -- a window not opened after all: the count it took back
  if hk == shared_hk and pending > 0 then
    pending = pending - 1
  else
    if hk == shared_hk then shared_hk = nil end  -- the history may be gone: look again
    release(hk)
  end
end
local function member(key, w)  -- the window's entry in pair: user, item, event id
  local user, id = string.match(key, '^([^\\t]*)\\t(.*)$')
  return user .. '\\t' .. w[6] .. '\\t' .. id
end
local function decision(label, key, w)
  local features = featured and redis.call('HGET', feat, key) or ''
  return label .. '\\t' .. key .. '\\t' .. w[6] .. '\\t' .. w[7] .. '\\t' .. w[4] .. '\\t' ..
    features .. '\\t' .. (redis.call('HGET', hist, w[8]) or '\\28')
end
local function bulk(command, key, args)  -- one command for many arguments, in slices
  for i = 1, #args, 1000 do
    redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
  end
end
local function values(key, fields)  -- HMGET in slices (unpack() has a small stack)
  local got = {}
  for i = 1, #fields, 1000 do
    for _, v in ipairs(redis.call('HMGET', key, unpack(fields, i, math.min(i + 999, #fields)))) do
      got[#got + 1] = v
    end
  end
  return got
end

-- undo what the previous batch did at offsets >= first, if it never committed (it ended at
-- the stamp: before first, it did)
local mark = redis.call('HMGET', part, 'newest', 'stamp', 'prev_newest', 'prev_stamp')
local redo = mark[2] and tonumber(mark[2]) >= first
for _, key in ipairs(redo and redis.call('SMEMBERS', jrn) or {}) do
  local v = redis.call('HGET', win, key)
  if v then
    local w = parse(v)
    if w[1] >= first then
      redis.call('HDEL', win, key)
      if featured then redis.call('HDEL', feat, key) end
      release(w[8])
      redis.call('ZREM', due, key)
      redis.call('ZREM', done, key)
      redis.call('ZREM', pair, member(key, w))
    elseif w[2] >= first or w[3] >= first then
      if w[2] >= first then w[2] = -1 end
      if w[3] >= first then
        w[3] = -1
        redis.call('ZREM', done, key)
        redis.call('ZADD', due, w[5], key)
      end
      redis.call('HSET', win, key, pack(w))
    end
  end
end
redis.call('DEL', jrn)
if redo then mark[1], mark[2] = mark[3], mark[4] end

local out, touched, late = {}, {}, 0
local text, num = '([^\\31]*)\\31', '(%-?%d+)\\31'
local line = '([icl])\\31' .. num .. text .. text .. text .. text .. num .. num .. text .. '([^\\n]*)\\n'
local page = nil  -- the history of the impression before: \\30 repeats it
local dues, pairs_ = {}, {}  -- the windows opened, added to due and pair in bulk
for kind, off, user, id, item, cat, ts, at, features, history in string.gmatch(ARGV[9], line) do
  local pkey = user .. '\\t' .. item
  if kind == 'i' then
    if history == '\\30' then history = page else page = history end
    local key = user .. '\\t' .. id
    local deadline = at  -- ts + window
    local hk = share(user, ts, key, history)
    local value = off .. '\\t-1\\t-1\\t' .. ts .. '\\t' .. deadline .. '\\t' .. item .. '\\t' .. cat ..
      '\\t' .. hk
    if redis.call('HSETNX', win, key, value) == 1 then
      if features ~= '' then
        redis.call('HSET', feat, key, features)
        featured = true
      end
      dues[#dues + 1] = deadline
      dues[#dues + 1] = key
      pairs_[#pairs_ + 1] = 0
      pairs_[#pairs_ + 1] = pkey .. '\\t' .. id
      touched[#touched + 1] = key
    else
      unshare(hk)
    end
  else
    if #pairs_ > 0 then  -- the impressions before it, findable
      bulk('ZADD', pair, pairs_)
      pairs_ = {}
    end
    local shown = redis.call('ZRANGEBYLEX', pair, '[' .. pkey .. '\\t', '(' .. pkey .. '\\t\\255')
    if #shown > 0 then
      local t, wm = tonumber(ts), tonumber(at)
      local best, bestkey, bestid, hit = nil, nil, nil, false
      for _, m in ipairs(shown) do
        local eid = string.sub(m, #pkey + 2)
        local key = user .. '\\t' .. eid
        local w = parse(redis.call('HGET', win, key))
        if tonumber(w[4]) <= t and t <= w[5] then
          if kind == 'l' then  -- a late click: did its watermark close this window lately?
            if w[2] < 0 and w[5] < wm and wm <= w[5] + retention then hit = true end
          elseif w[3] < 0 then
            local wts = tonumber(w[4])
            if best == nil or wts > tonumber(best[4]) or (wts == tonumber(best[4]) and eid > bestid) then
              best, bestkey, bestid = w, key, eid
            end
          end
        end
      end
      if hit then late = late + 1 end
      if best then
        out[#out + 1] = 'a' .. off
        if best[2] < 0 then
          best[2] = tonumber(off)
          redis.call('HSET', win, bestkey, pack(best))
          out[#out + 1] = decision('1', bestkey, best)
          touched[#touched + 1] = bestkey
        end
      end
    end
  end
end

settle()
if #pairs_ > 0 then bulk('ZADD', pair, pairs_) end
if #dues > 0 then bulk('ZADD', due, dues) end
if ARGV[5] ~= '' and ARGV[4] ~= '' then
  local allowed = tonumber(ARGV[5])
  -- forget the closed windows whose retention the committed watermark (as of the batch's
  -- start) has passed: no late click of this batch or a later one can count them
  if mark[1] and mark[1] ~= '' then
    local forget = '(' .. string.format('%d', tonumber(mark[1]) - allowed - retention)
    local gone = redis.call('ZRANGEBYSCORE', done, '-inf', forget)
    local held, members, counts, hks = values(win, gone), {}, {}, {}
    for i, key in ipairs(gone) do
      if held[i] then  -- its item and history key; a page's windows go together
        local item, hk = string.match(held[i], item_and_history)
        local user, id = string.match(key, '^([^\\t]*)\\t(.*)$')
        members[#members + 1] = user .. '\\t' .. item .. '\\t' .. id
        if counts[hk] then counts[hk] = counts[hk] + 1 else counts[hk], hks[#hks + 1] = 1, hk end
      end
    end
    if #gone > 0 then
      local unheld = {}  -- the histories no window holds any more
      for _, hk in ipairs(hks) do
        if redis.call('HINCRBY', refs, hk, -counts[hk]) <= 0 then unheld[#unheld + 1] = hk end
      end
      if #unheld > 0 then
        bulk('HDEL', hist, unheld)
        bulk('HDEL', refs, unheld)
      end
      if #members > 0 then bulk('ZREM', pair, members) end
      bulk('HDEL', win, gone)
      if featured then bulk('HDEL', feat, gone) end
      redis.call('ZREMRANGEBYSCORE', done, '-inf', forget)
    end
  end
  -- close the windows the watermark passed: negatives for those without a click
  local watermark = '(' .. string.format('%d', tonumber(ARGV[4]) - allowed)
  local closing = redis.call('ZRANGEBYSCORE', due, '-inf', watermark)
  if #closing > 0 then
    local held, fields, kept = values(win, closing), {}, {}
    local parsed, hks = {}, {}
    for i, value in ipairs(held) do
      parsed[i] = {string.match(value, as_strings)}
      hks[i] = parsed[i][7]
    end
    local histories = values(hist, hks)
    local features = featured and values(feat, closing) or {}
    local said = nil  -- the history key of the decision before: \\30 repeats its history
    local closed = string.format('%d', last)
    for i, key in ipairs(closing) do
      local opened, clicked, ts, deadline, item, cat, hk = unpack(parsed[i])
      fields[#fields + 1] = key
      fields[#fields + 1] = opened .. '\\t' .. clicked .. '\\t' .. closed .. '\\t' .. ts .. '\\t' ..
        deadline .. '\\t' .. item .. '\\t' .. cat .. '\\t' .. hk
      kept[#kept + 1] = deadline
      kept[#kept + 1] = key
      touched[#touched + 1] = key
      if clicked == '-1' then
        out[#out + 1] = '0\\t' .. key .. '\\t' .. item .. '\\t' .. cat .. '\\t' .. ts .. '\\t' ..
          (features[i] or '') .. '\\t' .. (hk == said and '\\30' or histories[i] or '\\28')
        said = hk
      end
    end
    bulk('HSET', win, fields)
    bulk('ZADD', done, kept)
    redis.call('ZREMRANGEBYSCORE', due, '-inf', watermark)
  end
end

if #touched > 0 then bulk('SADD', jrn, touched) end
-- two writes, never one: see the module docstring
redis.call('HSET', part, 'prev_newest', mark[1] or '', 'prev_stamp', mark[2] or '-1')
redis.call('HSET', part, 'newest', ARGV[4], 'stamp', ARGV[3])
for i = 2, featured and #KEYS or #KEYS - 1 do redis.call('PEXPIRE', KEYS[i], ARGV[8]) end  -- part: for good
out[#out + 1] = tostring(late)
return out
"""


def partition_keys(prefix: str, partition: Partition) -> list[str]:
    """The nine keys of a partition's state, in the order the scripts take them."""
    tag = f"{{{partition.topic}:{partition.partition}}}"
    names = ("part", "win", "hist", "refs", "pair", "due", "done", "jrn", "feat")
    return [f"{prefix}:{name}:{tag}" for name in names]


def parse_claim(reply: Sequence[Any]) -> Claim:
    """The claim script's answer."""
    epoch, newest, found = reply
    return Claim(int(epoch), int(newest) if newest not in ("", None) else None, bool(int(found)))


def advance_args(
    batch: PartitionBatch, window_ms: int, retention_ms: int, ttl_ms: int
) -> tuple[object, ...]:
    """The advance script's arguments for ``batch``."""
    newest = "" if batch.newest is None else batch.newest
    allowed = "" if batch.allowed_ms is None else batch.allowed_ms
    if batch.featured:
        inputs = _featured_inputs(batch, window_ms)
    else:  # the default schema's: as it always was, an empty features field in each line
        lines, before = [], None  # the impression before, whose history a page's next ones repeat
        for item in batch.inputs:
            history = ""
            if item.kind == "impression":
                if before is not None and before.items == item.items and before.categories == item.categories:
                    history = "\x1e"
                else:
                    history = "\x1d".join(item.items) + "\x1c" + "\x1d".join(item.categories)
                before = item
            lines.append(_line(item, history, window_ms))
        inputs = "".join(lines)
    return (batch.epoch, batch.first, batch.last, newest, allowed, window_ms, retention_ms, ttl_ms, inputs)


def _featured_inputs(batch: PartitionBatch, window_ms: int) -> str:
    """The input lines of a batch with declared features.

    An impression's features in its line's field, its history's after its categories (JSON
    holds no control character: it escapes them, so none of the separators).
    """
    lines, before = [], None
    for item in batch.inputs:
        history, features = "", ""
        if item.kind == "impression":
            seq = item.seq_features
            if (before is not None and before.items == item.items and before.categories == item.categories
                    and (before.seq_features is seq or before.seq_features == seq)):
                history = "\x1e"
            else:
                history = "\x1d".join(item.items) + "\x1c" + "\x1d".join(item.categories)
                if seq:
                    history += "\x1c" + _ENCODER.encode(seq).decode()
            if item.features is not None:
                features = _ENCODER.encode(item.features).decode()
            before = item
        e = item.event
        at = e.ts + window_ms if item.kind == "impression" else item.watermark
        lines.append(f"{_KINDS[item.kind]}\x1f{item.offset}\x1f{e.user_id}\x1f{e.event_id}\x1f{e.item_id}"
                     f"\x1f{e.category_id}\x1f{e.ts}\x1f{at}\x1f{features}\x1f{history}\n")
    return "".join(lines)


_KINDS = {"impression": "i", "click": "c", "late_click": "l"}


def _line(item: JoinInput, history: str, window_ms: int) -> str:
    e = item.event
    at = e.ts + window_ms if item.kind == "impression" else item.watermark
    return (f"{_KINDS[item.kind]}\x1f{item.offset}\x1f{e.user_id}\x1f{e.event_id}\x1f{e.item_id}"
            f"\x1f{e.category_id}\x1f{e.ts}\x1f{at}\x1f\x1f{history}\n")


def parse_advance(reply: Sequence[str]) -> PartitionOutcome:
    """The advance script's answer."""
    decisions, taken = [], set()
    said: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the history of the decision before
    seq: SeqFeatures | None = None
    for answer in reply[:-1]:
        if answer[0] == "a":
            taken.add(int(answer[1:]))
            continue
        label, user, event_id, item, category, ts, features, history = answer.split("\t")
        if history != "\x1e":
            items, _, categories = history.partition("\x1c")
            seq = None
            if "\x1c" in categories:  # the history's declared features follow
                categories, _, values = categories.partition("\x1c")
                seq = _SEQ.decode(values)
            said = (_ids(items), _ids(categories))
        if seq is not None or features:
            decisions.append(Decision(int(label), user, event_id, item, category, int(ts), *said,
                                      _FEATURES.decode(features) if features else {}, seq or {}))
        else:
            decisions.append(Decision(int(label), user, event_id, item, category, int(ts), *said))
    return PartitionOutcome(decisions, frozenset(taken), int(reply[-1]))


_ENCODER = msgspec.json.Encoder()
_FEATURES = msgspec.json.Decoder(Features)
_SEQ = msgspec.json.Decoder(SeqFeatures)


def _ids(joined: str) -> tuple[str, ...]:
    return tuple(joined.split("\x1d")) if joined else ()
