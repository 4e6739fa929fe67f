-- ack.lua: forget members the broker has confirmed.
-- KEYS[1] in-flight ZSET, KEYS[2] due HASH, KEYS[3] attempts HASH
-- ARGV    members (at most a few thousand per call)
-- Returns the number of members that were still in flight.
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- No member has been retried or recovered, so none of these can have
  -- been recovered and claimed again since our claim: everything named
  -- here is ours to forget.
  local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
  -- First attempts keep their due time in their claim's record, not here.
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HDEL', KEYS[2], unpack(ARGV))
  end
  return n
end
-- A member whose lease expired and was recovered elsewhere is no longer
-- ours to forget: its due time and attempt count now belong to its new
-- claim.
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
