-- retry.lua: reschedule members the broker refused (returned or nacked),
-- or dead-letter them once they have used up their attempts.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] due HASH,
-- KEYS[4] attempts HASH, KEYS[5] dead ZSET, KEYS[6] dead-reason HASH
-- ARGV[1] max attempts, ARGV[2] first backoff ms, ARGV[3] backoff cap ms,
-- ARGV[4] ms per score unit, ARGV[5] reason, ARGV[6..] member, due (ms) pairs
-- Returns {retried, dead}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_attempts = tonumber(ARGV[1])
local backoff = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local reason = ARGV[5]
local retried, dead = 0, 0
for i = 6, #ARGV, 2 do
  local m = ARGV[i]
  -- The broker refused this copy, so it was not delivered. Even if the
  -- member is no longer in flight (a producer re-added it and another copy
  -- was settled first), it must go back rather than vanish.
  redis.call('ZREM', KEYS[2], m)
  do
    local attempts = tonumber(redis.call('HGET', KEYS[4], m)) or 1
    if attempts >= max_attempts then
      redis.call('ZADD', KEYS[5], now, m)
      redis.call('HSET', KEYS[6], m, reason .. ' after ' .. attempts .. ' attempts')
      redis.call('HDEL', KEYS[3], m)
      redis.call('HDEL', KEYS[4], m)
      dead = dead + 1
    else
      local delay = math.min(cap, backoff * 2 ^ (attempts - 1))
      -- The next claim reads these to number its attempt and to keep the
      -- original due time (a first attempt's is not stored yet).
      redis.call('HSET', KEYS[4], m, attempts)
      redis.call('HSETNX', KEYS[3], m, ARGV[i + 1])
      redis.call('ZADD', KEYS[1], string.format('%.17g', (now + delay) / unit), m)
      retried = retried + 1
    end
  end
end
return {retried, dead}
