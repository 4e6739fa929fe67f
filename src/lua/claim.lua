-- claim.lua: recover expired leases, then claim due members, atomically.
-- The clock is Redis's own TIME, so every instance agrees on "due".
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] in-flight ZSET (score = lease deadline, epoch ms)
-- KEYS[3] due HASH (member -> original due, epoch ms)
-- KEYS[4] attempts HASH (member -> publish attempts so far)
-- ARGV[1] most members to claim (>= 0)
-- ARGV[2] lease, ms
-- ARGV[3] milliseconds per score unit (1 or 1000)
-- ARGV[4] most expired leases to recover
-- Returns {now_ms, next_due_ms or -1, recovered, m1, due1, attempt1, m2, ...}.
-- Members are returned as bulk strings, so an empty member is a member,
-- never "nothing due".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local unit = tonumber(ARGV[3])
local fmt = '%.17g'

local recovered = 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, m in ipairs(expired) do
  local due = tonumber(redis.call('HGET', KEYS[3], m)) or now
  -- NX: a producer that rescheduled the member meanwhile wins.
  redis.call('ZADD', KEYS[1], 'NX', string.format(fmt, due / unit), m)
  redis.call('ZREM', KEYS[2], m)
  recovered = recovered + 1
end

local out = {now, -1, recovered}
local claimed = 0
if limit > 0 then
  local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format(fmt, now / unit),
    'WITHSCORES', 'LIMIT', 0, limit)
  local deadline = now + lease
  for i = 1, #items, 2 do
    local m = items[i]
    -- A negative or -inf score is due at once; clamp it so it stays an integer.
    local due = math.max(0, math.floor(tonumber(items[i + 1]) * unit))
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZADD', KEYS[2], deadline, m)
    -- A retried member keeps the due time of its first claim, so its
    -- message_id and lateness stay those of the original schedule.
    if redis.call('HSETNX', KEYS[3], m, due) == 0 then
      due = tonumber(redis.call('HGET', KEYS[3], m))
    end
    local attempt = redis.call('HINCRBY', KEYS[4], m, 1)
    out[#out + 1] = m
    out[#out + 1] = due
    out[#out + 1] = attempt
    claimed = claimed + 1
  end
end

if claimed < limit or limit == 0 then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #head > 0 then
    local next_due = tonumber(head[2]) * unit
    -- Integer replies are truncated by Redis: clamp far-future and +inf
    -- scores to a value that still means "not soon".
    if next_due > 9e15 then next_due = 9e15 end
    if next_due < -9e15 then next_due = -9e15 end
    out[2] = math.ceil(next_due)
  end
end
return out
