-- tenants_head.lua: the earliest head among the tenants a claim could
-- release now, with Redis's clock and how many of them are due. A
-- sleeping scanner's wake-up hint compares the head with K's head, so
-- neither a paused tenant's overdue member nor one of a tenant held at its
-- tenant_window or its max_rate ends every idle sleep (the claim's next due
-- time and the window's wake-up already cover those). The express scanner
-- passes over every tenant the last claim saw due, and claims when a tenant
-- none has seen is due (src/scanner/express.rs).
-- KEYS[1] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[2] paused tenants HASH (tenant -> "<since ms> <by>")
-- ARGV[1] the business's score unit (ms per unit of a score)
-- ARGV[2] most due tenants to count ('0': none)
-- ARGV[3..] tenants to pass over
-- Returns {Redis's clock (epoch ms), the score (as a string) of the first
-- tenant in the index neither paused nor passed over, or '' when there is
-- none, how many such tenants are due (at most ARGV[2])}.

local unit, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local skip, skipped = {}, 0
for i = 3, #ARGV do
  skip[ARGV[i]] = true
  skipped = skipped + 1
end
local paused_count = redis.call('HLEN', KEYS[2])
local function open(tenant)
  return not skip[tenant]
    and (paused_count == 0 or redis.call('HEXISTS', KEYS[2], tenant) == 0)
end

local now = now_ms()
local head = redis.call('ZRANGE', KEYS[1], 0, paused_count + skipped, 'WITHSCORES')
local first = ''
for j = 1, #head, 2 do
  if open(head[j]) then
    first = head[j + 1]
    break
  end
end
local due = 0
if most > 0 and first ~= '' then
  local tenants = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', score_of(now, unit),
    'LIMIT', 0, paused_count + skipped + most)
  for _, tenant in ipairs(tenants) do
    if due >= most then break end
    if open(tenant) then due = due + 1 end
  end
end
return {now, first, due}
