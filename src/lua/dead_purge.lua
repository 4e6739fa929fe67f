-- dead_purge.lua: delete dead members for good, oldest first.
-- KEYS[1] dead ZSET, KEYS[2] dead-reason HASH, KEYS[3] pending ZSET K,
-- KEYS[4] in-flight ZSET, KEYS[5] body HASH (id mode; absent otherwise)
-- ARGV[1] most members to delete, ARGV[2..] which members: as prelude.lua's
-- dead_picked reads them ('oldest'; 'named' m1 m2 ...; 'digest' score
-- sha1; 'reason' text cursor...)
-- Returns step_reply's {n, ...}: n the number of members deleted. A named
-- member that is not dead is left alone. In id mode a dead id's body goes
-- with it, unless a producer has scheduled the id again.
local members, last, last_score, more = dead_picked(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV, 2)
local has_body = redis.call('EXISTS', KEYS[5]) == 1
for _, m in ipairs(members) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
  if has_body and not redis.call('ZSCORE', KEYS[3], m) and not redis.call('ZSCORE', KEYS[4], m) then
    redis.call('HDEL', KEYS[5], m)
  end
end
return step_reply(#members, last, last_score, more)
