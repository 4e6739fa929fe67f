-- extend.lua: push the lease deadline of members still awaiting a confirm,
-- so a slow or blocked broker does not let another instance recover them.
-- KEYS[1] in-flight ZSET
-- ARGV[1] lease ms, ARGV[2..] members
-- Returns the number of leases extended (members still in flight).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
return n
