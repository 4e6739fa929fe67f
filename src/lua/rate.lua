-- rate.lua: a publish budget shared by every process of a business, kept
-- as a GCRA "theoretical arrival time" on Redis's clock, so that N
-- processes together publish at most max_rate per second.
-- KEYS[1] the business's rate key: the arrival time (µs since the epoch)
--         of the next publish the budget allows; gone while the budget is full
-- ARGV[1] µs per publish (1e6 / max_rate)
-- ARGV[2] burst: publishes the budget holds when full
-- ARGV[3] 'take' or 'give'
-- take: ARGV[4] the most wanted now (<= burst), ARGV[5] the fewest worth taking
--       Returns {granted, 0}, or {0, ms to wait} when fewer than ARGV[5] are free.
-- give: ARGV[4] publishes granted but not used (members that were not due)
--       Returns {0, 0}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end

local function store(v)
  if v <= now then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.format('%.17g', v), 'PX', math.ceil((v - now) / 1000))
  end
end

if ARGV[3] == 'give' then
  store(tat - tonumber(ARGV[4]) * interval)
  return {0, 0}
end

local want = tonumber(ARGV[4])
local least = tonumber(ARGV[5])
local free = math.floor((now + burst * interval - tat) / interval + 1e-9)
if free < least then
  local wait_us = tat + (least - burst) * interval - now
  return {0, math.max(1, math.ceil(wait_us / 1000))}
end
local granted = math.min(free, want)
store(tat + granted * interval)
return {granted, 0}
