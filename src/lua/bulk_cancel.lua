-- bulk_cancel.lua: cancel a batch of pending members by name, as cancel.lua
-- cancels one: atomically with respect to claims, so each member is either
-- removed before any claim sees it or left to the delivery under way.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] body HASH (id mode; any key name in body mode, it is not touched)
-- ARGV[1] '1' in id mode, '0' in body mode, ARGV[2..] the members
-- Returns the number of members removed from pending. An id's body goes
-- with it unless a delivery under way or the dead set still needs it.
local id_mode = ARGV[1] == '1'
local n = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  if redis.call('ZREM', KEYS[1], m) == 1 then
    n = n + 1
    if id_mode and not redis.call('ZSCORE', KEYS[2], m)
        and not redis.call('ZSCORE', KEYS[3], m) then
      redis.call('HDEL', KEYS[4], m)
    end
  end
end
return n
