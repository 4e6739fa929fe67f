-- ack.lua: forget members the broker has confirmed, and the records of
-- claims this settles completely.
-- KEYS[1] in-flight ZSET, KEYS[2] meta HASH, KEYS[3] claims HASH
-- ARGV[1] number r of record ids, ARGV[2..r+1] record ids, then groups of
-- {tag, n, m1..mn}: the members one claim (tag) holds; at most a few
-- thousand members per call.
-- Returns the number of members forgotten. A member whose in-flight tag is
-- not the group's (its lease expired and another claim took it, or this
-- call already ran once) is not ours to forget and is left alone.
local r = tonumber(ARGV[1])
if r > 0 then
  redis.call('HDEL', KEYS[3], unpack(ARGV, 2, r + 1))
end
local has_meta = redis.call('EXISTS', KEYS[2]) == 1
local total = 0
local i = r + 2
while i <= #ARGV do
  local tag = tonumber(ARGV[i])
  local n = tonumber(ARGV[i + 1])
  local first, last = i + 2, i + 1 + n
  i = last + 1
  if n > 0 then
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, first, last))
    local ours = {}
    for k, score in ipairs(scores) do
      if score then
        local s = tonumber(score)
        if math.floor((s - math.floor(s)) * 1024 + 0.5) == tag then
          ours[#ours + 1] = ARGV[first + k - 1]
        end
      end
    end
    if #ours > 0 then
      redis.call('ZREM', KEYS[1], unpack(ours))
      if has_meta then redis.call('HDEL', KEYS[2], unpack(ours)) end
      total = total + #ours
    end
  end
end
return total
