-- histogram.lua: how many pending members come due in each window ahead,
-- one ZCOUNT (O(log N)) per window, so the cost does not grow with N.
-- KEYS[1] pending ZSET K
-- ARGV[1] ms per score unit, ARGV[2..] window ends as offsets from now, ms,
-- ascending (the first is usually 0: what is overdue)
-- Returns {now_ms, n0, n1, ..., nk}: n0 due by now + ARGV[2] (overdue ones
-- included), n_i due after now + ARGV[i+1] and by now + ARGV[i+2], and the
-- last, nk, due after the last end.
local now = now_ms()
local unit = tonumber(ARGV[1])
local out = {now}
local lo = '-inf'
for i = 2, #ARGV do
  local hi = string.format('%.17g', (now + tonumber(ARGV[i])) / unit)
  out[#out + 1] = redis.call('ZCOUNT', KEYS[1], lo, hi)
  lo = '(' .. hi
end
out[#out + 1] = redis.call('ZCOUNT', KEYS[1], lo, '+inf')
return out
