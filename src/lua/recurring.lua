-- recurring.lua: write schedule occurrences ahead, exactly once whatever the
-- number of instances, and forget the future occurrences of a schedule that
-- changed or was removed. Each group names what its caller read as the
-- schedule's state; a group whose state moved since (another instance wrote
-- first) changes nothing, so every occurrence is written by one pass only.
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (id -> body)
-- KEYS[3] schedules HASH (schedule -> "<fingerprint> <handled up to, ms>")
-- KEYS[4] occurrences ZSET (ids written for a time still ahead, score = due ms)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2], ... groups of {op, schedule, expected state ('' for none), new
--   state, n, id1, due1 (ms), body1, ..., idn, duen, bodyn}; op is 'write',
--   'replace' (forget the schedule's future occurrences first) or 'remove'
--   (forget them and the schedule; n = 0)
-- Returns, per group, {written, forgotten}, or {-1, 0} when its state moved.
local now = now_ms()
local unit = tonumber(ARGV[1])
local out = {}

-- Removes the pending occurrences of `name` due after now. One already in
-- flight is being delivered and stays.
local function forget(name)
  local prefix = name .. '@'
  local gone = 0
  local ids = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf')
  for _, id in ipairs(ids) do
    if string.sub(id, 1, #prefix) == prefix then
      if redis.call('ZREM', KEYS[1], id) == 1 then
        redis.call('HDEL', KEYS[2], id)
        gone = gone + 1
      end
      redis.call('ZREM', KEYS[4], id)
    end
  end
  return gone
end

local err = wrong_type(KEYS[1])
if err then return err end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local i = 2
while i <= #ARGV do
  local op, name, expected, state = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local n = tonumber(ARGV[i + 4])
  local first = i + 5
  i = first + 3 * n
  if (redis.call('HGET', KEYS[3], name) or '') ~= expected then
    out[#out + 1] = {-1, 0}
  else
    local forgotten = 0
    if op ~= 'write' then forgotten = forget(name) end
    local written = 0
    for j = first, first + 3 * n - 1, 3 do
      local id, due, body = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2]
      if redis.call('ZADD', KEYS[1], 'NX', score_of(due, unit), id) == 1 then
        redis.call('HSET', KEYS[2], id, body)
        written = written + 1
      end
      if due > now then redis.call('ZADD', KEYS[4], due, id) end
    end
    if op == 'remove' then
      redis.call('HDEL', KEYS[3], name)
    else
      redis.call('HSET', KEYS[3], name, state)
    end
    out[#out + 1] = {written, forgotten}
  end
end
return out
