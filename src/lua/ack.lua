-- ack.lua: forget members the broker has confirmed, and the records of
-- claims this settles completely.
-- KEYS[1] in-flight ZSET, KEYS[2] due HASH, KEYS[3] attempts HASH,
-- KEYS[4] claims HASH
-- ARGV[1] number r of claim ids, ARGV[2..r+1] claim ids,
-- ARGV[r+2..] members (at most a few thousand per call)
-- Returns the number of members that were still in flight.
local r = tonumber(ARGV[1])
if r > 0 then
  redis.call('HDEL', KEYS[4], unpack(ARGV, 2, r + 1))
end
local members = {unpack(ARGV, r + 2)}
if #members == 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- No member has been retried or recovered, so none of these can have
  -- been recovered and claimed again since our claim: everything named
  -- here is ours to forget.
  local n = redis.call('ZREM', KEYS[1], unpack(members))
  -- First attempts keep their due time in their claim's record, not here.
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HDEL', KEYS[2], unpack(members))
  end
  return n
end
-- A member whose lease expired and was recovered elsewhere is no longer
-- ours to forget: its due time and attempt count now belong to its new
-- claim.
local present = redis.call('ZMSCORE', KEYS[1], unpack(members))
local ours = {}
for i, score in ipairs(present) do
  if score then ours[#ours + 1] = members[i] end
end
if #ours > 0 then
  redis.call('ZREM', KEYS[1], unpack(ours))
  redis.call('HDEL', KEYS[2], unpack(ours))
  redis.call('HDEL', KEYS[3], unpack(ours))
end
return #ours
