-- list.lua: one page of pending members in due order, after a cursor.
-- Paging is by (score, member), the order Redis keeps, so a page costs
-- O(log N + page) however deep it is and however many members there are
-- (prelude.lua's page_after). Members come back as glimpses, so a page of
-- n members is at most n x 4 KiB however large the bodies in body mode,
-- and a call copies about 8 MiB of members into Lua at most (a page of
-- large members stops there, short, with more = 1).
-- KEYS[1] pending ZSET K (or a tenant's set, or the dead set)
-- ARGV[1] lowest score ('-inf' or a number), ARGV[2] highest score
-- ('+inf' or a number), ARGV[3] page size n (>= 1), ARGV[4] cursor score
-- ('' for the first page), ARGV[5] cursor member (the last one shown, or
-- its first 4 KiB), ARGV[6] cursor member's SHA-1 when ARGV[5] is only its
-- start ('' or absent: ARGV[5] is the whole member)
-- Returns {more, m1, size1, sha1_1, score1, m2, ...} with at most n
-- members (each as prelude.lua's push_glimpse gives it), all after the
-- cursor and within the score range; more is 1 when at least one further
-- member may be in range.
local n = tonumber(ARGV[3])
local items, cut = page_after(KEYS[1], ARGV[1], ARGV[2], n, ARGV[4], ARGV[5], ARGV[6] or '')
local out = {0}
for i = 1, math.min(#items, 2 * n), 2 do
  push_glimpse(out, items[i])
  out[#out + 1] = items[i + 1]
end
if #items > 2 * n or cut then out[1] = 1 end
return out
