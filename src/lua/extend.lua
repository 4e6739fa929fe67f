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
local i = 2
while i <= #ARGV do
  local tag = tonumber(ARGV[i])
  local n = tonumber(ARGV[i + 1])
  local first, last = i + 2, i + 1 + n
  i = last + 1
  if n > 0 then
    local deadline = inflight_score(now + lease, tag)
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, first, last))
    local args = {}
    for k, score in ipairs(scores) do
      if score and tag_of(score) == tag then
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[first + k - 1]
      end
    end
    if #args > 0 then
      redis.call('ZADD', KEYS[1], 'XX', unpack(args))
      total = total + #args / 2
    end
  end
end
return total
