-- tenants_head.lua: the earliest head among the tenants not paused, what a
-- wake-up hint compares with K's head, so a paused tenant's overdue member
-- does not end every idle sleep.
-- KEYS[1] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[2] paused tenants HASH (tenant -> "<since ms> <by>")
-- Returns the score (as a string) of the first tenant in the index that is
-- not paused, or false when there is none.

local paused_count = redis.call('HLEN', KEYS[2])
local head = redis.call('ZRANGE', KEYS[1], 0, paused_count, 'WITHSCORES')
for j = 1, #head, 2 do
  if paused_count == 0 or redis.call('HEXISTS', KEYS[2], head[j]) == 0 then
    return head[j + 1]
  end
end
return false
