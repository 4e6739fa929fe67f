-- tenant_resume.lua: lets a paused tenant's members be claimed again, and
-- writes the tenant into the index afresh, so the index's keyspace event
-- wakes idle scanners at once rather than at their next look.
-- KEYS[1] paused tenants HASH (tenant -> "<since ms> <by>")
-- KEYS[2] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[3] the tenant's sorted set
-- ARGV[1] the tenant
-- Returns 1 if the tenant was paused, else 0.

if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
redis.call('ZREM', KEYS[2], ARGV[1])
if #head > 0 then
  redis.call('ZADD', KEYS[2], head[2], ARGV[1])
end
return 1
