-- dead_purge.lua: delete dead members for good, oldest first.
-- KEYS[1] dead ZSET, KEYS[2] dead-reason HASH
-- ARGV[1] most members to delete
-- Returns the number of members deleted.
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
for _, m in ipairs(members) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
end
return #members
