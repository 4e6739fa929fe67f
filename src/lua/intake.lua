-- intake.lua: store messages taken from an intake queue (id mode): each
-- id's envelope in the body hash and the id in K at its due time, together,
-- so no claim ever sees an id without its body. A message whose id is
-- already stored replaces it (a re-publish with the same message_id moves
-- the schedule); within one call the later message wins.
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (task id -> envelope)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2], ARGV[3], ARGV[4], ... three values per message: the id; when it
--         is due: '0' (now), '+<ms>' (this long after now) or '@<ms>' (at
--         this epoch ms, now if past); the envelope
-- Returns Redis's clock when it stored them, epoch ms. Due times are on
-- that clock, like every claim's "now", and never past 2^53 ms.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local unit = tonumber(ARGV[1])
local LATEST = 9007199254740992
local CHUNK = 1000
local bodies, scores = {}, {}
for i = 2, #ARGV, 3 do
  local id, when = ARGV[i], ARGV[i + 1]
  local due = now
  local sign, ms = string.sub(when, 1, 1), tonumber(string.sub(when, 2))
  if sign == '+' and ms then
    due = now + ms
  elseif sign == '@' and ms then
    due = math.max(now, ms)
  end
  due = math.min(due, LATEST)
  bodies[#bodies + 1] = id
  bodies[#bodies + 1] = ARGV[i + 2]
  scores[#scores + 1] = score_of(due, unit)
  scores[#scores + 1] = id
end
for i = 1, #bodies, CHUNK * 2 do
  local j = math.min(#bodies, i + CHUNK * 2 - 1)
  redis.call('HSET', KEYS[2], unpack(bodies, i, j))
  redis.call('ZADD', KEYS[1], unpack(scores, i, j))
end
return now
