-- dead_requeue.lua: move dead members back to pending, due now, attempts reset.
-- KEYS[1] pending ZSET K, KEYS[2] dead ZSET, KEYS[3] dead-reason HASH,
-- KEYS[4] due HASH, KEYS[5] attempts HASH
-- ARGV[1] most members to move, ARGV[2] ms per score unit
-- Returns the number of members requeued.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local unit = tonumber(ARGV[2])
local members = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1)
for _, m in ipairs(members) do
  redis.call('ZADD', KEYS[1], string.format('%.17g', now / unit), m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('HDEL', KEYS[4], m)
  redis.call('HDEL', KEYS[5], m)
end
return #members
