-- prelude.lua: helpers every script starts with (src/redis_conn/scripts.rs
-- builds each as this file followed by its own), so the formulas that must
-- agree between scripts are written once.
-- No KEYS, ARGV or return of its own: it only defines local functions.

-- Redis's own clock in ms, so every instance agrees on "now" and "due".
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An in-flight score is the lease deadline in ms plus tag/1024: the whole
-- part says when the lease expires, the fraction which claim holds it.
local function inflight_score(deadline_ms, tag)
  return string.format('%.17g', deadline_ms + tag / 1024)
end

-- The claim tag an in-flight score carries (see inflight_score).
local function tag_of(score)
  local s = tonumber(score)
  return math.floor((s - math.floor(s)) * 1024 + 0.5)
end

-- Walks the groups {tag, n, m1..mn} of `args` from index `i` to its end,
-- one per claim, calling each(tag, ours) with the group's members whose
-- score in the in-flight set `inflight` still carries its tag, if any. The
-- rest are not the claim's to settle: their lease expired and another claim
-- holds them, or this call already ran once.
local function each_held(inflight, args, i, each)
  while i <= #args do
    local tag = tonumber(args[i])
    local n = tonumber(args[i + 1])
    local first, last = i + 2, i + 1 + n
    i = last + 1
    if n > 0 then
      local scores = redis.call('ZMSCORE', inflight, unpack(args, first, last))
      local ours = {}
      for k, score in ipairs(scores) do
        if score and tag_of(score) == tag then
          ours[#ours + 1] = args[first + k - 1]
        end
      end
      if #ours > 0 then each(tag, ours) end
    end
  end
end

-- A member longer than GLIMPSE bytes leaves a listing script as a glimpse:
-- its first GLIMPSE bytes, its length and its SHA-1, so no reply carries a
-- whole body of a business in body mode (src/store/glimpse.rs reads it).
local GLIMPSE = 4096

-- Appends `m` to `out` as three values: the member, '' and '' when it is
-- at most GLIMPSE bytes, else its first GLIMPSE bytes, length and SHA-1.
local function push_glimpse(out, m)
  if #m <= GLIMPSE then
    out[#out + 1] = m
    out[#out + 1] = ''
    out[#out + 1] = ''
  else
    out[#out + 1] = string.sub(m, 1, GLIMPSE)
    out[#out + 1] = #m
    out[#out + 1] = redis.sha1hex(m)
  end
end

-- Scores come back as digits, 'inf' or '-inf'.
local function score_num(s)
  if s == '+inf' or s == 'inf' then return math.huge end
  if s == '-inf' then return -math.huge end
  return tonumber(s)
end

-- Redis orders equal scores by memcmp of the members, shorter first on a
-- common prefix; Lua's '<' goes through strcoll, so compare bytes here.
local function bytes_after(a, b)
  local la, lb = #a, #b
  for i = 1, math.min(la, lb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return la > lb
end

-- Bytes of the members in a flat {member, score, ...} list (a ZSCAN or
-- ZRANGE ... WITHSCORES reply): what reading them had Redis copy into Lua.
local function scanned_bytes(flat)
  local bytes = 0
  for i = 1, #flat, 2 do bytes = bytes + #flat[i] end
  return bytes
end

-- Bytes of members one call of a listing script copies into Lua at most
-- (and one member more): Redis copies each member it hands to Lua at
-- about 8 ms per MiB on a 2-core VM, so a page of 1,000 body-mode members
-- of 1 MiB would hold Redis, and every delivery, for seconds.
local PAGE_BYTES = 8388608

-- Up to `want` {member, score, ...} read by fetch(offset, count) (a
-- ZRANGE ... WITHSCORES from where the page starts), a few at a time:
-- first one, then as many as PAGE_BYTES holds at the sizes seen, so a
-- page of small members is two calls and one of large members stops near
-- PAGE_BYTES. Returns the items and whether it stopped short of `want`
-- with more still to read.
local function read_bounded(fetch, want)
  local items, got, bytes, chunk = {}, 0, 0, 1
  while got < want do
    local part = fetch(got, chunk)
    for i = 1, #part do items[#items + 1] = part[i] end
    bytes = bytes + scanned_bytes(part)
    got = got + #part / 2
    if #part < 2 * chunk then return items, false end
    if bytes >= PAGE_BYTES and got < want then return items, true end
    local each = math.max(1, math.ceil(bytes / got))
    chunk = math.max(1, math.min(want - got, math.floor((PAGE_BYTES - bytes) / each)))
  end
  return items, false
end

-- Up to n + 1 {member, score, ...} of `key` with scores in lo..hi (Redis's
-- bounds), after the cursor in Redis's order: score `cs` ('' from the
-- start) and member `cm`, or, when `cd` is not '', the longer member whose
-- first GLIMPSE bytes are `cm` and whose SHA-1 is `cd`; and, second,
-- whether it stopped short at PAGE_BYTES (read_bounded) with more to read.
-- Costs O(log N) calls however many members share the cursor's score: a
-- page goes on by rank while the cursor member is where it was, else from
-- the first member after it, found by a binary search over its score's
-- ranks. A cursor member given by its glimpse that is gone (or is not
-- among the first 64 members sharing its score and first GLIMPSE bytes)
-- resumes at the first of those, so a page may repeat one but never skips
-- one.
local function page_after(key, lo, hi, n, cs, cm, cd)
  if cs == '' then
    return read_bounded(function(off, count)
      return redis.call('ZRANGE', key, lo, hi, 'BYSCORE', 'LIMIT', off, count, 'WITHSCORES')
    end, n + 1)
  end
  local hin = score_num(hi)
  local function from_rank(r)
    return read_bounded(function(off, count)
      local got = redis.call('ZRANGE', key, r + off, r + off + count - 1, 'WITHSCORES')
      local items = {}
      for i = 1, #got, 2 do
        if score_num(got[i + 1]) > hin then break end
        items[#items + 1] = got[i]
        items[#items + 1] = got[i + 1]
      end
      return items
    end, n + 1)
  end
  if cd == '' then
    local rank = redis.call('ZRANK', key, cm)
    local score = rank and redis.call('ZSCORE', key, cm)
    if rank and score_num(score) == score_num(cs) then
      return from_rank(rank + 1)
    end
  end
  local a = redis.call('ZCOUNT', key, '-inf', '(' .. cs)
  local b = a + redis.call('ZCOUNT', key, cs, cs)
  local top = b
  while a < b do
    local mid = math.floor((a + b) / 2)
    local m = redis.call('ZRANGE', key, mid, mid)[1]
    if bytes_after(m, cm) then b = mid else a = mid + 1 end
  end
  if cd ~= '' then
    -- Rank a starts the members that share the cursor's first GLIMPSE
    -- bytes (longer ones sort right after their prefix): find it by digest.
    for r = a, math.min(a + 63, top - 1) do
      local m = redis.call('ZRANGE', key, r, r)[1]
      if string.sub(m, 1, GLIMPSE) ~= cm then break end
      if redis.sha1hex(m) == cd then return from_rank(r + 1) end
    end
  end
  return from_rank(a)
end

-- The dead members a purge or requeue acts on, at most `most`, as
-- `args` from index `from` picks them: 'oldest'; 'named', then the
-- members (those in the dead set `dead`); 'digest', then a score and a
-- SHA-1 (the longer member a listing showed by its glimpse, looked for
-- among the first 256 that died at that score); or 'reason', then a text,
-- a cursor (score, member or its first GLIMPSE bytes, its SHA-1 or '') and
-- the most members to read: those after the cursor whose reason in
-- `reasons` contains the text. For 'reason' also returns the last member
-- read and its score (the next cursor; nil when none was read) and whether
-- more lie after it.
local function dead_picked(dead, reasons, most, args, from)
  local kind = args[from]
  if kind == 'oldest' then
    return redis.call('ZRANGE', dead, 0, most - 1)
  end
  local members = {}
  if kind == 'named' then
    for i = from + 1, math.min(#args, most + from) do
      if redis.call('ZSCORE', dead, args[i]) then members[#members + 1] = args[i] end
    end
  elseif kind == 'digest' then
    local score = args[from + 1]
    local same = redis.call('ZRANGE', dead, score, score, 'BYSCORE', 'LIMIT', 0, 256)
    for _, m in ipairs(same) do
      if #m > GLIMPSE and redis.sha1hex(m) == args[from + 2] then
        members[1] = m
        break
      end
    end
  elseif kind == 'reason' then
    local text, read = args[from + 1], tonumber(args[from + 5])
    local items, cut = page_after(dead, '-inf', '+inf', read, args[from + 2], args[from + 3], args[from + 4])
    local last, last_score
    local i = 1
    while i <= math.min(#items, 2 * read) and #members < most do
      local m = items[i]
      local reason = redis.call('HGET', reasons, m)
      if reason and string.find(reason, text, 1, true) then members[#members + 1] = m end
      last, last_score = m, items[i + 1]
      i = i + 2
    end
    return members, last, last_score, i <= #items or cut
  end
  return members
end

-- The reply of a script that acted on `n` members of a walk: {n} when it
-- walks nothing, else {n, more, the last member read as a glimpse, its
-- score} ({n, 0} when none was read), the next call's cursor.
local function step_reply(n, last, last_score, more)
  if not last then return {n, 0} end
  local out = {n, more and 1 or 0}
  push_glimpse(out, last)
  out[#out + 1] = last_score
  return out
end

-- An error reply when `key` holds something other than a sorted set (an
-- absent key is an empty one), else nil. Scripts that write K check it
-- before any write: a ZADD failing after a ZREM would lose the member.
local function wrong_type(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'zset' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a sorted set')
  end
  return nil
end

-- A due time in ms as a score in K, in the business's score units
-- (`unit` ms each), printed so that it reads back exactly.
local function score_of(due_ms, unit)
  return string.format('%.17g', due_ms / unit)
end

-- The retry state of a member in {K}:meta: the attempts made, its first
-- due time (ms), and the score delayd gave it in K ('' while in flight: a
-- member whose score in K differs was re-added by a producer).
local function meta_value(attempts, due_ms, score)
  return attempts .. ':' .. string.format('%.0f', due_ms) .. ':' .. score
end

-- A {K}:meta value -> attempts (number), due (string), score (string, may
-- be ''); nil for anything else.
local function parse_meta(v)
  if not v then return nil end
  local a, d, s = string.match(v, '^(%d+):(%-?%d+):(.*)$')
  if not a then return nil end
  return tonumber(a), d, s
end

-- The id of a claim's record in {K}:claims: the claim's time and tag.
local function record_id(now_ms, tag)
  return string.format('%.0f', now_ms) .. ':' .. tag
end

-- Removes a recurring schedule's pending occurrences due after `now` from
-- K (`pending`), its bodies and the occurrences set, and returns how many
-- left K. One already in flight is being delivered and stays.
local function forget_occurrences(pending, body, occurrences, name, now)
  local prefix = name .. '@'
  local gone = 0
  local ids = redis.call('ZRANGEBYSCORE', occurrences, '(' .. now, '+inf')
  for _, id in ipairs(ids) do
    if string.sub(id, 1, #prefix) == prefix then
      if redis.call('ZREM', pending, id) == 1 then
        redis.call('HDEL', body, id)
        gone = gone + 1
      end
      redis.call('ZREM', occurrences, id)
    end
  end
  return gone
end

-- The name an id's delivery is recorded under in the dedup record of a
-- business that stores intake envelopes: the id with 16 hex digits of its
-- envelope's SHA-1, so that a redelivery of the same message is dropped
-- while a different message reusing the id is delivered. `body` is nil
-- (or false, from HMGET) when the id has none. An id intake.lua derived
-- for a message whose id was taken (the id, '#', 16 hex digits of its
-- envelope's SHA-1) already is that name: the same message stored under
-- the plain id and under the derived one is then recorded, and dropped,
-- as one.
local function dedup_name(id, body)
  if not body then return id end
  local tail = '#' .. string.sub(redis.sha1hex(body), 1, 16)
  if string.sub(id, -#tail) == tail then return id end
  return id .. tail
end
