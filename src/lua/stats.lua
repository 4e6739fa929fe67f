-- stats.lua: one consistent look at a key family, for inspect and metrics.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] paused STRING, KEYS[5] tenant index ZSET (read only with
-- tenants: tenant -> due score of its earliest member)
-- ARGV[1] ms per score unit
-- ARGV[2] the prefix of tenant set names ("{K}:tenant:"), '' for a
--         business without tenants
-- ARGV[3] most tenants whose sets are counted: the earliest in the index
-- ARGV[4..] forecast windows, ms
-- Returns {now_ms, pending, due_now, oldest_due_ms or '', next_future_due_ms or '',
--          in_flight, dead, paused ("<since ms> <by>" or ''), due_within_1,
--          due_within_2, ..., tenants in the index, tenants counted}; times
--          are strings so nothing is truncated. due_within_i counts the
--          pending members due by now + window i, overdue ones included.
--          Pending, due and the times cover K and the counted tenants'
--          sets (paused ones too: their members are pending).
local now = now_ms()
local unit = tonumber(ARGV[1])
local nowu = string.format('%.17g', now / unit)
local windows = {}
for i = 4, #ARGV do
  windows[#windows + 1] = string.format('%.17g', (now + tonumber(ARGV[i])) / unit)
end
local pending, due_now, oldest, nxt = 0, 0, nil, nil
local within = {}
for i = 1, #windows do within[i] = 0 end

-- Adds one sorted set's members to the totals; false if it is not one.
local function count(set)
  local n = redis.pcall('ZCARD', set)
  if type(n) ~= 'number' then return false end
  pending = pending + n
  if n == 0 then return true end
  local due = redis.call('ZCOUNT', set, '-inf', nowu)
  due_now = due_now + due
  if due > 0 then
    local head = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2])
    if not oldest or head < oldest then oldest = head end
  end
  local fut = redis.call('ZRANGEBYSCORE', set, '(' .. nowu, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #fut > 0 then
    local f = tonumber(fut[2])
    if not nxt or f < nxt then nxt = f end
  end
  for i, w in ipairs(windows) do
    within[i] = within[i] + redis.call('ZCOUNT', set, '-inf', w)
  end
  return true
end

if not count(KEYS[1]) then return wrong_type(KEYS[1]) end
local tenants, counted = 0, 0
if ARGV[2] ~= '' then
  tenants = redis.call('ZCARD', KEYS[5])
  for _, t in ipairs(redis.call('ZRANGE', KEYS[5], 0, tonumber(ARGV[3]) - 1)) do
    -- A tenant's key of another type is the claim's to report, not this.
    if count(ARGV[2] .. t) then counted = counted + 1 end
  end
end

local function ms(score)
  if not score then return '' end
  return string.format('%.17g', score * unit)
end
local out = {tostring(now), pending, due_now, ms(oldest), ms(nxt), redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]), redis.call('GET', KEYS[4]) or ''}
for i = 1, #windows do
  out[#out + 1] = within[i]
end
out[#out + 1] = tenants
out[#out + 1] = counted
return out
