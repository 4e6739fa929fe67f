-- cancel.lua: cancel one task by its member (the id in id mode, the body in
-- body mode), atomically with respect to the claim script: a task is either
-- cancelled before any claim sees it, or reported in flight, never both.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] body HASH (id mode; any key name in body mode, it is not touched)
-- ARGV[1] the member, ARGV[2] '1' in id mode, '0' in body mode
-- Returns {state, removed}: state 'cancelled', 'in_flight', 'dead' or
-- 'not_found'; removed is 1 when a pending copy was removed.
local m = ARGV[1]
local id_mode = ARGV[2] == '1'
local in_flight = redis.call('ZSCORE', KEYS[2], m)
local removed = redis.call('ZREM', KEYS[1], m)
if in_flight then
  -- The delivery under way still needs the body (a retry publishes it
  -- again), so only a pending copy re-added meanwhile goes.
  return {'in_flight', removed}
end
local dead = redis.call('ZSCORE', KEYS[3], m)
if id_mode and not dead then
  -- Also clears the orphan a producer's bare ZREM left behind.
  redis.call('HDEL', KEYS[4], m)
end
if removed == 1 then return {'cancelled', 1} end
if dead then return {'dead', 0} end
return {'not_found', 0}
