-- sweep.lua: delete per-member state that nothing needs any more, a slice
-- at a time, so cancelled members and lost settle writes leave nothing
-- behind for longer than a sweep period. Run periodically, never per claim.
-- KEYS[1] pending ZSET K, KEYS[2] in-flight ZSET, KEYS[3] meta HASH,
-- KEYS[4] claims HASH
-- ARGV[1] HSCAN cursor into the meta hash ('0' to start)
-- ARGV[2] fields to look at per call
-- ARGV[3] lease ms: records younger than this are never touched
-- Returns {next cursor ('0' when the pass is done), meta deleted, records
-- deleted, meta entries left (HLEN)}. Cheap when idle: two EXISTS and an
-- HLEN.
local now = now_ms()
local count = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local cursor, metas_deleted, records_deleted = '0', 0, 0

if redis.call('EXISTS', KEYS[3]) == 1 then
  -- A meta entry is live while its member is in flight, or pending at the
  -- score delayd gave it. Otherwise a producer cancelled (ZREM) or
  -- re-added the member, and the entry is stale.
  local r = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', count)
  cursor = r[1]
  local stale = {}
  for i = 1, #r[2], 2 do
    local m, v = r[2][i], r[2][i + 1]
    if not redis.call('ZSCORE', KEYS[2], m) then
      local _, _, s = parse_meta(v)
      local p = redis.call('ZSCORE', KEYS[1], m)
      if not (p and s and s ~= '' and tonumber(s) == tonumber(p)) then
        stale[#stale + 1] = m
      end
    end
  end
  if #stale > 0 then
    redis.call('HDEL', KEYS[3], unpack(stale))
    metas_deleted = #stale
  end
end

-- Claim records are deleted by the ack that settles a claim's last member;
-- one whose settle write was lost, or whose process died, goes once it is
-- older than a lease and none of its members is still held by its claim.
-- Only on the first slice of a pass, and at most `count` records.
if ARGV[1] == '0' and redis.call('EXISTS', KEYS[4]) == 1 then
  local ids = redis.call('HKEYS', KEYS[4])
  local looked = 0
  for _, id in ipairs(ids) do
    if looked >= count then break end
    local ms, tg = string.match(id, '^(%d+):(%d+)$')
    if not ms then
      redis.call('HDEL', KEYS[4], id)
      records_deleted = records_deleted + 1
    elseif tonumber(ms) + lease < now then
      looked = looked + 1
      tg = tonumber(tg)
      local list = cmsgpack.unpack(redis.call('HGET', KEYS[4], id))
      local held = false
      for x = 1, #list, 2 do
        local s = redis.call('ZSCORE', KEYS[2], list[x])
        if s and tag_of(s) == tg then held = true; break end
      end
      if not held then
        redis.call('HDEL', KEYS[4], id)
        records_deleted = records_deleted + 1
      end
    end
  end
end
return {cursor, metas_deleted, records_deleted, redis.call('HLEN', KEYS[3])}
