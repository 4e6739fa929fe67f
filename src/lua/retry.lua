-- retry.lua: hand members a claim holds back to pending, or dead-letter
-- them. One script for every way back, so each keeps the member in K,
-- in flight or dead at every step:
--   "release"  never confirmed (stop deadline, broken channel, topology
--              error): back at its original due time, attempt not counted;
--   "nack"     refused for now (queue full, no quorum leader): back after
--              ARGV[3] ms, attempt not counted, never dead;
--   "refused"  refused for good (returned unroutable, rejected): back after
--              a backoff doubling from ARGV[3] ms up to ARGV[4] ms, or dead
--              once it has used ARGV[2] attempts.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] meta HASH,
-- KEYS[4] dead ZSET, KEYS[5] dead-reason HASH
-- ARGV[1] mode, ARGV[2] max attempts, ARGV[3] (first) backoff ms,
-- ARGV[4] backoff cap ms, ARGV[5] ms per score unit, ARGV[6] reason,
-- then groups of {tag, n, m1, due1, attempt1, ..., mn, duen, attemptn}.
-- Returns {back, dead, skipped}. A member whose in-flight tag is not the
-- group's is skipped: this call already ran (a lost reply, retried), or
-- the lease expired and another claim holds the member now. The producer's
-- own schedule wins: a member already pending again is not moved.
-- Checked before any write: a failed ZADD after the ZREM would lose it.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local mode = ARGV[1]
local max_attempts = tonumber(ARGV[2])
local backoff = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local unit = tonumber(ARGV[5])
local reason = ARGV[6]
local back, dead, skipped = 0, 0, 0
local i = 7
while i <= #ARGV do
  local tag = tonumber(ARGV[i])
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  for _ = 1, n do
    local m, due, attempt = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    i = i + 3
    local score = redis.call('ZSCORE', KEYS[2], m)
    if not score or tag_of(score) ~= tag then
      skipped = skipped + 1
    elseif mode == 'refused' and attempt >= max_attempts then
      redis.call('ZADD', KEYS[4], now, m)
      redis.call('HSET', KEYS[5], m, reason .. ' after ' .. attempt .. ' attempts')
      redis.call('HDEL', KEYS[3], m)
      redis.call('ZREM', KEYS[2], m)
      dead = dead + 1
    else
      local at, made
      if mode == 'release' then
        at, made = due, attempt - 1
      elseif mode == 'nack' then
        at, made = now + backoff, attempt - 1
      else
        at, made = now + math.min(cap, backoff * 2 ^ (attempt - 1)), attempt
      end
      local pscore = score_of(at, unit)
      -- Written before the member leaves the in-flight set, so no failure
      -- in between can leave it nowhere.
      if redis.call('ZADD', KEYS[1], 'NX', pscore, m) == 1 then
        redis.call('HSET', KEYS[3], m, meta_value(math.max(0, made), due, pscore))
      else
        redis.call('HDEL', KEYS[3], m)
      end
      redis.call('ZREM', KEYS[2], m)
      back = back + 1
    end
  end
end
return {back, dead, skipped}
