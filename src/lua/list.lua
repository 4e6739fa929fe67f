-- list.lua: one page of pending members in due order, after a cursor.
-- Paging is by (score, member), the order Redis keeps, so a page costs
-- O(log N + page) however deep it is and however many members there are.
-- KEYS[1] pending ZSET K
-- ARGV[1] lowest score ('-inf' or a number), ARGV[2] highest score
-- ('+inf' or a number), ARGV[3] page size n (>= 1), ARGV[4] cursor score
-- ('' for the first page), ARGV[5] cursor member (the last one shown)
-- Returns {more, m1, score1, m2, score2, ...} with at most n members, all
-- after the cursor and within the score range; more is 1 when at least one
-- further member is in range.
local lo, hi, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cs, cm = ARGV[4], ARGV[5]

-- Scores come back as digits, 'inf' or '-inf'.
local function num(s)
  if s == '+inf' or s == 'inf' then return math.huge end
  if s == '-inf' then return -math.huge end
  return tonumber(s)
end
local hin = num(hi)

-- Redis orders equal scores by memcmp of the members, shorter first on a
-- common prefix; Lua's '<' goes through strcoll, so compare bytes here.
local function after(a, b)
  local la, lb = #a, #b
  for i = 1, math.min(la, lb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return la > lb
end

local items = {}
-- Keeps the (member, score) pairs of `got` up to the highest score.
local function take(got)
  for i = 1, #got, 2 do
    if num(got[i + 1]) > hin then break end
    items[#items + 1] = got[i]
    items[#items + 1] = got[i + 1]
  end
end

if cs == '' then
  items = redis.call('ZRANGE', KEYS[1], lo, hi, 'BYSCORE', 'LIMIT', 0, n + 1, 'WITHSCORES')
else
  local rank = redis.call('ZRANK', KEYS[1], cm)
  local score = rank and redis.call('ZSCORE', KEYS[1], cm)
  if rank and num(score) == num(cs) then
    -- The cursor member is still where it was: continue by rank.
    take(redis.call('ZRANGE', KEYS[1], rank + 1, rank + n + 1, 'WITHSCORES'))
  else
    -- It was claimed, cancelled or moved since: find the first member
    -- after it in Redis's order by a binary search over the ranks of its
    -- score's members, O(log N) calls of O(log N), however many share it.
    local a = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. cs)
    local b = a + redis.call('ZCOUNT', KEYS[1], cs, cs)
    while a < b do
      local mid = math.floor((a + b) / 2)
      local m = redis.call('ZRANGE', KEYS[1], mid, mid)[1]
      if after(m, cm) then b = mid else a = mid + 1 end
    end
    take(redis.call('ZRANGE', KEYS[1], a, a + n, 'WITHSCORES'))
  end
end
local out = {0}
for i = 1, math.min(#items, 2 * n), 2 do
  out[#out + 1] = items[i]
  out[#out + 1] = items[i + 1]
end
if #items > 2 * n then out[1] = 1 end
return out
