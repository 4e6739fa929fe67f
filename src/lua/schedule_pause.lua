-- schedule_pause.lua: pause or resume one recurring schedule on every
-- instance. A pause takes back the occurrences already written ahead, so
-- nothing of the schedule comes due after it; the writer (recurring.lua)
-- writes none while the pause field is set. A resume records the schedule
-- handled up to now, so what fell in the pause is neither caught up nor
-- counted missed, and the next pass writes what comes after.
-- KEYS[1] pending ZSET K (the business's first key)
-- KEYS[2] body HASH (id -> body)
-- KEYS[3] schedules HASH (see recurring.lua)
-- KEYS[4] occurrences ZSET (ids written for a time still ahead)
-- ARGV[1] 'pause' or 'resume'
-- ARGV[2] the schedule's name
-- ARGV[3] who pauses (a token's name or 'cli'; pause only)
-- Returns {changed (1, or 0 when it was paused already / not paused),
--   occurrences taken back}.
local now = now_ms()
local name = ARGV[2]
local field = '@paused:' .. name
if ARGV[1] == 'pause' then
  if redis.call('HSETNX', KEYS[3], field, string.format('%.0f', now) .. ' ' .. ARGV[3]) == 0 then
    return {0, 0}
  end
  return {1, forget_occurrences(KEYS[1], KEYS[2], KEYS[4], name, now)}
end
if redis.call('HDEL', KEYS[3], field) == 0 then
  return {0, 0}
end
local state = redis.call('HGET', KEYS[3], name)
local fp = state and string.match(state, '^%S+')
if fp then
  redis.call('HSET', KEYS[3], name, fp .. ' ' .. string.format('%.0f', now))
end
return {1, 0}
