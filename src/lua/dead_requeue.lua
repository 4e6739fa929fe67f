-- dead_requeue.lua: move dead members back to pending, due now, attempts reset.
-- KEYS[1] pending ZSET K, KEYS[2] dead ZSET, KEYS[3] dead-reason HASH,
-- KEYS[4] meta HASH
-- ARGV[1] most members to move, ARGV[2] ms per score unit
-- Returns the number of members requeued. A dead member that a producer has
-- scheduled again keeps the producer's due time: it only leaves the dead set.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local unit = tonumber(ARGV[2])
local members = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1)
for _, m in ipairs(members) do
  redis.call('ZADD', KEYS[1], 'NX', string.format('%.17g', now / unit), m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('HDEL', KEYS[4], m)
end
return #members
