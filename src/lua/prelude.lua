-- prelude.lua: helpers every script in store.rs starts with (each is built
-- as this file followed by its own), so the formulas that must agree
-- between scripts are written once.
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
