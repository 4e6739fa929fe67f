-- tenants_list.lua: a page of a business's tenants in index order (the
-- earliest head first), each with its counts, for the API and the CLI.
-- KEYS[1] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[2] paused tenants HASH (tenant -> "<since ms> <by>")
-- KEYS[3] weights set at run time HASH (tenant -> weight)
-- KEYS[4] released HASH (tenant -> "<second> <moved in it> <moved in the
--         second before>", as claim_tenants.lua keeps it)
-- KEYS[5] max_rates set at run time HASH (tenant -> members a second)
-- ARGV[1] the prefix of tenant set names ("{K}:tenant:")
-- ARGV[2] rank in the index of the page's first tenant
-- ARGV[3] most tenants on the page (the caller bounds it)
-- ARGV[4] ms per unit of score (1, or 1000 for scores in seconds)
-- Returns {now ms (Redis's clock), tenants in the index, paused tenants,
-- {tenant1, pending1, due1, head score1 or '', paused1 or '', weight1 or
-- '', released1, max_rate1 or '', tenant2, ...}}: due counts members whose score is at or
-- below now, released those claims moved out of its set in the last whole
-- second of Redis's clock.

local now = now_ms()
local top = score_of(now, tonumber(ARGV[4]))
local first = tonumber(ARGV[2])
local second = math.floor(now / 1000)

-- Members released in the second before this one.
local function released(tenant)
  local was = redis.call('HGET', KEYS[4], tenant)
  if not was then return 0 end
  local s, c, p = string.match(was, '^(%d+) (%d+) (%d+)$')
  s = tonumber(s)
  if s == second then return tonumber(p) end
  if s == second - 1 then return tonumber(c) end
  return 0
end

local page = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[3]) - 1)
local rows = {}
for _, tenant in ipairs(page) do
  local set = ARGV[1] .. tenant
  local head = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  rows[#rows + 1] = tenant
  rows[#rows + 1] = redis.call('ZCARD', set)
  rows[#rows + 1] = redis.call('ZCOUNT', set, '-inf', top)
  rows[#rows + 1] = head[2] or ''
  rows[#rows + 1] = redis.call('HGET', KEYS[2], tenant) or ''
  rows[#rows + 1] = redis.call('HGET', KEYS[3], tenant) or ''
  rows[#rows + 1] = released(tenant)
  rows[#rows + 1] = redis.call('HGET', KEYS[5], tenant) or ''
end
return {now, redis.call('ZCARD', KEYS[1]), redis.call('HLEN', KEYS[2]), rows}
