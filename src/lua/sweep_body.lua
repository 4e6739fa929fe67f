-- sweep_body.lua: id mode's share of the periodic sweep: delete bodies
-- whose id is not pending, in flight or dead, which a producer's bare
-- `ZREM K id` cancel leaves behind. A slice of the body hash per call, so
-- the sweep never holds Redis long, and never run per claim.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] body HASH
-- ARGV[1] HSCAN cursor ('0' to start a pass), ARGV[2] fields per call
-- Returns {next cursor ('0' when the pass is done), bodies deleted, HLEN}.
-- Producers write a body and its id in one MULTI, so a body is never seen
-- here before its id.
if redis.call('EXISTS', KEYS[4]) == 0 then return {'0', 0, 0} end
local r = redis.call('HSCAN', KEYS[4], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local orphans = {}
for i = 1, #r[2], 2 do
  local m = r[2][i]
  if not redis.call('ZSCORE', KEYS[1], m) and not redis.call('ZSCORE', KEYS[2], m)
    and not redis.call('ZSCORE', KEYS[3], m) then
    orphans[#orphans + 1] = m
  end
end
if #orphans > 0 then redis.call('HDEL', KEYS[4], unpack(orphans)) end
return {r[1], #orphans, redis.call('HLEN', KEYS[4])}
