-- tenants_head.lua: the earliest head among the tenants a claim could
-- release now, what a wake-up hint compares with K's head, so neither a
-- paused tenant's overdue member nor one of a tenant held at its
-- tenant_window or its max_rate ends every idle sleep (the claim's next due
-- time and the window's wake-up already cover those).
-- KEYS[1] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[2] paused tenants HASH (tenant -> "<since ms> <by>")
-- ARGV[1..] tenants to pass over: those the last claim reported due and
--           could not release
-- Returns the score (as a string) of the first tenant in the index that is
-- neither paused nor passed over, or false when there is none.

local skip = {}
for _, tenant in ipairs(ARGV) do skip[tenant] = true end
local paused_count = redis.call('HLEN', KEYS[2])
local head = redis.call('ZRANGE', KEYS[1], 0, paused_count + #ARGV, 'WITHSCORES')
for j = 1, #head, 2 do
  local tenant = head[j]
  if not skip[tenant]
    and (paused_count == 0 or redis.call('HEXISTS', KEYS[2], tenant) == 0) then
    return head[j + 1]
  end
end
return false
