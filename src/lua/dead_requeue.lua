-- dead_requeue.lua: move dead members back to pending, due now, attempts reset.
-- KEYS[1] pending ZSET K, KEYS[2] dead ZSET, KEYS[3] dead-reason HASH,
-- KEYS[4] meta HASH
-- ARGV[1] most members to move, ARGV[2] ms per score unit,
-- ARGV[3..] which members: as prelude.lua's dead_picked reads them
-- ('oldest'; 'named' m1 m2 ...; 'digest' score sha1; 'reason' text cursor...)
-- Returns step_reply's {n, ...}: n the number of members requeued. A named
-- member that is not dead is left alone. A dead member that a producer has
-- scheduled again keeps the producer's due time: it only leaves the dead set.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local unit = tonumber(ARGV[2])
local members, last, last_score, more = dead_picked(KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV, 3)
for _, m in ipairs(members) do
  redis.call('ZADD', KEYS[1], 'NX', score_of(now, unit), m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('HDEL', KEYS[4], m)
end
return step_reply(#members, last, last_score, more)
