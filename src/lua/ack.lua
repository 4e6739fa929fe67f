-- ack.lua: forget members the broker has confirmed.
-- KEYS[1] in-flight ZSET, KEYS[2] due HASH, KEYS[3] attempts HASH
-- ARGV    members (at most a few thousand per call)
-- Returns the number of members that were still in flight. A member whose
-- lease expired and was recovered elsewhere is no longer ours to forget:
-- its due time and attempt count now belong to its new claim.
local present = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
local ours = {}
for i, score in ipairs(present) do
  if score then ours[#ours + 1] = ARGV[i] end
end
if #ours > 0 then
  redis.call('ZREM', KEYS[1], unpack(ours))
  redis.call('HDEL', KEYS[2], unpack(ours))
  redis.call('HDEL', KEYS[3], unpack(ours))
end
return #ours
