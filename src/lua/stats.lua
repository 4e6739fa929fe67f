-- stats.lua: one consistent look at a key family, for inspect and metrics.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] paused STRING
-- ARGV[1] ms per score unit, ARGV[2..] forecast windows, ms
-- Returns {now_ms, pending, due_now, oldest_due_ms or '', next_future_due_ms or '',
--          in_flight, dead, paused ("<since ms> <by>" or ''), due_within_1,
--          due_within_2, ...}; times are
--          strings so nothing is truncated. due_within_i counts the pending
--          members due by now + window i, overdue ones included.
local now = now_ms()
local unit = tonumber(ARGV[1])
local nowu = string.format('%.17g', now / unit)
local pending = redis.call('ZCARD', KEYS[1])
local due_now = redis.call('ZCOUNT', KEYS[1], '-inf', nowu)
local oldest, nxt = '', ''
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head > 0 and due_now > 0 then
  oldest = string.format('%.17g', tonumber(head[2]) * unit)
end
local fut = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. nowu, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if #fut > 0 then
  nxt = string.format('%.17g', tonumber(fut[2]) * unit)
end
local out = {tostring(now), pending, due_now, oldest, nxt, redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]), redis.call('GET', KEYS[4]) or ''}
for i = 2, #ARGV do
  out[#out + 1] = redis.call('ZCOUNT', KEYS[1], '-inf',
    string.format('%.17g', (now + tonumber(ARGV[i])) / unit))
end
return out
