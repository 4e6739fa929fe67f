-- scan_glimpse.lua: one ZSCAN step of a search by prefix, its matches as
-- glimpses (prelude.lua's push_glimpse), so a step's reply is at most
-- (matches) x 4 KiB however large the members in body mode; or only how
-- many matched. Redis copies every match into Lua all the same, so the
-- reply says how many bytes that was, for the caller to size its next
-- COUNT (src/tasks/step_size.rs).
-- KEYS[1] a pending ZSET (K or a tenant's set)
-- ARGV[1] ZSCAN cursor ('0' to start), ARGV[2] MATCH pattern, ARGV[3]
-- COUNT, ARGV[4] 'count' for the count alone (absent: the matches)
-- Returns {next cursor, bytes of the matches, m1, size1, sha1_1, score1,
-- m2, ...}, or with 'count' {next cursor, bytes of the matches, matches}.
local r = redis.call('ZSCAN', KEYS[1], ARGV[1], 'MATCH', ARGV[2], 'COUNT', tonumber(ARGV[3]))
local bytes = scanned_bytes(r[2])
if ARGV[4] == 'count' then return {r[1], bytes, #r[2] / 2} end
local out = {r[1], bytes}
for i = 1, #r[2], 2 do
  push_glimpse(out, r[2][i])
  out[#out + 1] = r[2][i + 1]
end
return out
