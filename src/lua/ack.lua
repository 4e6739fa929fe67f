-- ack.lua: forget members the broker has confirmed.
-- KEYS[1] in-flight ZSET, KEYS[2] due HASH, KEYS[3] attempts HASH
-- ARGV    members
-- Returns the number of members that were still in flight (a member whose
-- lease expired and was recovered elsewhere is no longer ours to forget).
local n = 0
for _, m in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], m) == 1 then
    redis.call('HDEL', KEYS[2], m)
    redis.call('HDEL', KEYS[3], m)
    n = n + 1
  end
end
return n
