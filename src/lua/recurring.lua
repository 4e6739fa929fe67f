-- recurring.lua: write schedule occurrences ahead, exactly once whatever the
-- number of instances, and forget the future occurrences of a schedule that
-- changed or was removed. Each group names what its caller read as the
-- schedule's state; a group whose state moved since (another instance wrote
-- first) changes nothing, so every occurrence is written by one pass only.
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (id -> body)
-- KEYS[3] schedules HASH (schedule -> "<fingerprint> <handled up to, ms>";
--   beside it, fields no schedule name can take: '@paused:S' -> "<since ms>
--   <by>" while S is paused, '@missed:S' -> occurrences S missed in all,
--   '@last:S' -> the due ms of the latest occurrence of S written)
-- KEYS[4] occurrences ZSET (ids written for a time still ahead, score = due ms)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2], ... groups of {op, schedule, expected state ('' for none), new
--   state, missed, n, id1, due1 (ms), body1, ..., idn, duen, bodyn}; op is
--   'write', 'replace' (forget the schedule's future occurrences first) or
--   'remove' (forget them and the schedule; n = 0)
-- A paused schedule's group writes no occurrence and records it handled up
-- to now only, whatever its caller read: a pause that lands between a
-- pass's read and its call still stops every occurrence, and a resume
-- writes the ones after it.
-- Returns, per group, {written, forgotten}, or {-1, 0} when its state moved.
local now = now_ms()
local unit = tonumber(ARGV[1])
local out = {}

local err = wrong_type(KEYS[1])
if err then return err end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local i = 2
while i <= #ARGV do
  local op, name, expected, state = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local missed = tonumber(ARGV[i + 4])
  local n = tonumber(ARGV[i + 5])
  local first = i + 6
  i = first + 3 * n
  if (redis.call('HGET', KEYS[3], name) or '') ~= expected then
    out[#out + 1] = {-1, 0}
  else
    local forgotten = 0
    if op ~= 'write' then forgotten = forget_occurrences(KEYS[1], KEYS[2], KEYS[4], name, now) end
    local written = 0
    local last = nil
    if op ~= 'remove' and redis.call('HEXISTS', KEYS[3], '@paused:' .. name) == 1 then
      n = 0
      missed = 0
      state = string.match(state, '^%S+') .. ' ' .. string.format('%.0f', now)
    end
    for j = first, first + 3 * n - 1, 3 do
      local id, due, body = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2]
      if redis.call('ZADD', KEYS[1], 'NX', score_of(due, unit), id) == 1 then
        redis.call('HSET', KEYS[2], id, body)
        written = written + 1
      end
      if due > now then redis.call('ZADD', KEYS[4], due, id) end
      if not last or due > last then last = due end
    end
    if op == 'remove' then
      redis.call('HDEL', KEYS[3], name, '@paused:' .. name, '@missed:' .. name, '@last:' .. name)
    else
      redis.call('HSET', KEYS[3], name, state)
      if missed > 0 then redis.call('HINCRBY', KEYS[3], '@missed:' .. name, missed) end
      if last then
        local was = tonumber(redis.call('HGET', KEYS[3], '@last:' .. name) or '0')
        if last > was then redis.call('HSET', KEYS[3], '@last:' .. name, string.format('%.0f', last)) end
      end
    end
    out[#out + 1] = {written, forgotten}
  end
end
return out
