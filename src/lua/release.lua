-- release.lua: hand back members that were claimed but never confirmed
-- (shutdown deadline, broken channel), at their original due time.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] due HASH,
-- KEYS[4] attempts HASH
-- ARGV[1] ms per score unit, ARGV[2..] member, due (ms) pairs
-- Returns the number of members handed back.
local unit = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV, 2 do
  local m = ARGV[i]
  if redis.call('ZREM', KEYS[2], m) == 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    -- A retried member's first due time is kept in KEYS[3]; a first
    -- attempt's comes from the caller.
    local due = tonumber(redis.call('HGET', KEYS[3], m)) or tonumber(ARGV[i + 1]) or now
    -- NX: a producer that rescheduled the member meanwhile wins.
    redis.call('ZADD', KEYS[1], 'NX', string.format('%.17g', due / unit), m)
    -- The attempt did not happen (or is unknown): do not count it.
    if redis.call('HINCRBY', KEYS[4], m, -1) <= 0 then
      redis.call('HDEL', KEYS[4], m)
      redis.call('HDEL', KEYS[3], m)
    end
    n = n + 1
  end
end
return n
