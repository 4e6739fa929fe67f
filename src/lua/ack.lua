-- ack.lua: forget members the broker has confirmed, and the records of
-- claims this settles completely.
-- KEYS[1] in-flight ZSET, KEYS[2] meta HASH, KEYS[3] claims HASH,
-- KEYS[4] pending ZSET K, KEYS[5] body HASH, KEYS[6] delivered ZSET
-- ARGV[1] '1' in id mode, '2' in id mode with intake envelopes (the
-- record names an id with its content: dedup_name), else '0';
-- ARGV[2] dedup window ms (0: none)
-- ARGV[3] number r of record ids, ARGV[4..r+3] record ids, then the prefix
-- of tenant set names ('' without tenants) and the number t of pairs
-- {id, tenant} that follow: in id mode, the tenant a claimed id was moved
-- from, where it is looked for besides K; then groups of {tag, n, m1..mn}:
-- the members one claim (tag) holds; at most a few thousand members per
-- call.
-- In id mode a delivered id's body goes too, unless a producer has
-- scheduled the id again meanwhile, in K or in the tenant's set it came
-- from (then the body is the new copy's), and
-- with a window the id is recorded as delivered: the record is trimmed to
-- the window here and expires whole when no delivery renews it.
-- Returns the number of members forgotten. A member whose in-flight tag is
-- not the group's (its lease expired and another claim took it, or this
-- call already ran once) is not ours to forget and is left alone.
local id_mode = ARGV[1] ~= '0'
local by_content = ARGV[1] == '2'
local window = tonumber(ARGV[2]) or 0
local r = tonumber(ARGV[3])
if r > 0 then
  redis.call('HDEL', KEYS[3], unpack(ARGV, 4, r + 3))
end
local prefix, t = ARGV[r + 4], tonumber(ARGV[r + 5])
local owner = {}
for i = r + 6, r + 5 + 2 * t, 2 do owner[ARGV[i]] = ARGV[i + 1] end
local has_meta = redis.call('EXISTS', KEYS[2]) == 1
local now
if id_mode and window > 0 then
  now = now_ms()
end
local total = 0
local delivered = 0
each_held(KEYS[1], ARGV, r + 6 + 2 * t, function(_, ours)
  redis.call('ZREM', KEYS[1], unpack(ours))
  if has_meta then redis.call('HDEL', KEYS[2], unpack(ours)) end
  total = total + #ours
  if id_mode then
    local names = ours
    if now and by_content then
      local bodies = redis.call('HMGET', KEYS[5], unpack(ours))
      names = {}
      for k, m in ipairs(ours) do names[k] = dedup_name(m, bodies[k]) end
    end
    local again = redis.call('ZMSCORE', KEYS[4], unpack(ours))
    local done = {}
    for k, sc in ipairs(again) do
      local m = ours[k]
      if not sc and not (owner[m] and redis.call('ZSCORE', prefix .. owner[m], m)) then
        done[#done + 1] = m
      end
    end
    if #done > 0 then redis.call('HDEL', KEYS[5], unpack(done)) end
    if now then
      local rec = {}
      local at = string.format('%.0f', now)
      for _, m in ipairs(names) do
        rec[#rec + 1] = at
        rec[#rec + 1] = m
      end
      redis.call('ZADD', KEYS[6], unpack(rec))
      delivered = delivered + #ours
    end
  end
end)
if delivered > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', string.format('%.0f', now - window))
  redis.call('PEXPIRE', KEYS[6], window)
end
return total
