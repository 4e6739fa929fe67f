-- bulk_pending.lua: one batch of a bulk cancel or reschedule, picked and
-- acted on in one call, so no member leaves Redis (a body in body mode
-- may be large): the reply names at most the last member read, as a
-- glimpse. Cancelling is as bulk_cancel.lua, moving as `ZADD XX CH`.
-- KEYS[1] pending set (K or a tenant's), KEYS[2] in-flight ZSET,
-- KEYS[3] dead ZSET, KEYS[4] body HASH (id mode; not touched in body
-- mode), KEYS[5] tenant index ZSET (touched only when ARGV[3] names one)
-- ARGV[1] '1' in id mode, '0' in body mode
-- ARGV[2] 'cancel', or the score to move the picked members to
-- ARGV[3] the tenant whose set KEYS[1] is ('' for K): a move lowers its
-- index entry, so an earlier due time is claimed on time
-- ARGV[4] most members to act on
-- ARGV[5] 'due', then ARGV[6] lowest score, ARGV[7] highest score,
-- ARGV[8..10] the cursor as list.lua takes it (score, member or its first
-- 4 KiB, SHA-1 or ''); or 'prefix', then ARGV[6] the ZSCAN cursor,
-- ARGV[7] its MATCH pattern, ARGV[8] its COUNT
-- Returns for 'due' prelude.lua's step_reply ({n, more, the last member
-- read as a glimpse, its score}); for 'prefix' {n, next ZSCAN cursor,
-- bytes of the matches, matches} (Redis copies each match into Lua: the
-- caller sizes its next COUNT by them); n the members cancelled or moved.
local id_mode, act, tenant = ARGV[1] == '1', ARGV[2], ARGV[3]
local most = tonumber(ARGV[4])
local n = 0
local function on(m)
  if act == 'cancel' then
    if redis.call('ZREM', KEYS[1], m) == 1 then
      n = n + 1
      if id_mode and not redis.call('ZSCORE', KEYS[2], m)
          and not redis.call('ZSCORE', KEYS[3], m) then
        redis.call('HDEL', KEYS[4], m)
      end
    end
  else
    n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', act, m)
  end
end
local function moved()
  if act ~= 'cancel' and tenant ~= '' and n > 0 then
    redis.call('ZADD', KEYS[5], 'XX', 'LT', act, tenant)
  end
end

if ARGV[5] == 'prefix' then
  local r = redis.call('ZSCAN', KEYS[1], ARGV[6], 'MATCH', ARGV[7], 'COUNT', tonumber(ARGV[8]))
  local seen, picked = {}, 0
  for i = 1, #r[2], 2 do
    local m = r[2][i]
    if picked < most and not seen[m] then
      seen[m] = true
      picked = picked + 1
      on(m)
    end
  end
  moved()
  return {n, r[1], scanned_bytes(r[2]), #r[2] / 2}
end

local items, cut = page_after(KEYS[1], ARGV[6], ARGV[7], most, ARGV[8], ARGV[9], ARGV[10])
local last, last_score
for i = 1, math.min(#items, 2 * most), 2 do
  on(items[i])
  last, last_score = items[i], items[i + 1]
end
moved()
return step_reply(n, last, last_score, #items > 2 * most or cut)
