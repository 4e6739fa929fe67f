-- dead_list.lua: dead members, oldest first, with when and why they died,
-- each as a glimpse (prelude.lua's push_glimpse), so a page of n is at
-- most n x (4 KiB + its reason); a call copies about 8 MiB of members
-- into Lua at most (prelude.lua's read_bounded), stopping short there.
-- KEYS[1] dead ZSET, KEYS[2] dead-reason HASH
-- ARGV[1] most members to list, ARGV[2] members to skip first (0 if absent)
-- Returns {now_ms, short, m1, size1, sha1_1, died1_ms, reason1, m2, ...}:
-- short is 1 when the call stopped at its byte bound with more to read.
local now = now_ms()
local skip = tonumber(ARGV[2] or '0')
local items, cut = read_bounded(function(off, count)
  return redis.call('ZRANGE', KEYS[1], skip + off, skip + off + count - 1, 'WITHSCORES')
end, tonumber(ARGV[1]))
local out = {now, cut and 1 or 0}
for i = 1, #items, 2 do
  push_glimpse(out, items[i])
  out[#out + 1] = items[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], items[i]) or ''
end
return out
