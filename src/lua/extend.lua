-- extend.lua: push the lease deadline of members a claim still holds, so a
-- slow or blocked broker does not let another instance recover them.
-- KEYS[1] in-flight ZSET
-- ARGV[1] lease ms, then groups of {tag, n, m1..mn}
-- Returns the number of leases extended. The claim's tag stays the
-- fraction of the new deadline; members another claim holds now are left
-- alone.
local now = now_ms()
local lease = tonumber(ARGV[1])
local total = 0
each_held(KEYS[1], ARGV, 2, function(tag, ours)
  local deadline = inflight_score(now + lease, tag)
  local args = {}
  for _, m in ipairs(ours) do
    args[#args + 1] = deadline
    args[#args + 1] = m
  end
  redis.call('ZADD', KEYS[1], 'XX', unpack(args))
  total = total + #ours
end)
return total
