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

-- The dead members a purge or requeue acts on: those named in `args` from
-- index `from` on (at most `most` of them) that are in the dead set `dead`,
-- or, when none is named, the `most` oldest.
local function dead_picked(dead, most, args, from)
  if #args < from then
    return redis.call('ZRANGE', dead, 0, most - 1)
  end
  local members = {}
  for i = from, math.min(#args, most + from - 1) do
    if redis.call('ZSCORE', dead, args[i]) then members[#members + 1] = args[i] end
  end
  return members
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
