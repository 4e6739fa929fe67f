-- claim.lua: recover expired leases, then claim due members, atomically.
-- The clock is Redis's own TIME, so every instance agrees on "due".
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] in-flight ZSET (score = lease deadline, epoch ms)
-- KEYS[3] due HASH (member -> original due, epoch ms)
-- KEYS[4] attempts HASH (member -> attempt number of its latest claim;
--         absent means 1 while claimed, 0 while pending)
-- KEYS[5] claims HASH (claim id -> msgpack list {m1, due1, m2, due2, ...} of
--         the members of one claim whose due time is not in KEYS[3])
-- ARGV[1] most members to claim (>= 0)
-- ARGV[2] lease, ms
-- ARGV[3] milliseconds per score unit (1 or 1000)
-- ARGV[4] most expired leases to recover
-- ARGV[5] a random tag for this claim's id
-- Returns {now_ms, next_due_ms or -1, recovered, claim id or '', m1, due1,
-- attempt1, m2, ...}; each due is an integer or its decimal digits. The
-- caller deletes the claim's record once every member of it is settled.
-- Members are returned as bulk strings, so an empty member is a member,
-- never "nothing due". Writes are batched per command: one removal from K
-- also means one keyspace event per claim, not one per member.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local unit = tonumber(ARGV[3])
local fmt = '%.17g'
-- Lua's unpack is bounded by the C stack; stay well below it.
local CHUNK = 1000

local function batched(cmd, key, list, per)
  for i = 1, #list, CHUNK * per do
    local j = math.min(#list, i + CHUNK * per - 1)
    redis.call(cmd, key, unpack(list, i, j))
  end
end

-- A claim id starts with its claim time, so the newest record that names a
-- member is the claim that holds it now.
local function claimed_at(id)
  return tonumber(string.match(id, '^(%d+):')) or 0
end

local recovered = 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
if #expired > 0 then
  local dues, wanted = {}, {}
  local gone = {}
  for i, m in ipairs(expired) do
    gone[m] = true
    dues[i] = redis.call('HGET', KEYS[3], m)
    if not dues[i] then wanted[m] = i end
  end
  -- Every record is read whenever a lease has expired: for the due times
  -- of first attempts, and to retire the records of claims whose process
  -- died or stalled.
  local records, lists, newest = redis.call('HGETALL', KEYS[5]), {}, {}
  for r = 1, #records, 2 do
    local id = records[r]
    local list = cmsgpack.unpack(records[r + 1])
    lists[id] = list
    for k = 1, #list, 2 do
      local m = list[k]
      if not newest[m] or claimed_at(id) > claimed_at(newest[m]) then
        newest[m] = id
      end
    end
  end
  for id, list in pairs(lists) do
    for k = 1, #list, 2 do
      local i = wanted[list[k]]
      if i and newest[list[k]] == id then dues[i] = list[k + 1] end
    end
  end
  for i, m in ipairs(expired) do
    local due = tonumber(dues[i]) or now
    -- NX: a producer that rescheduled the member meanwhile wins.
    redis.call('ZADD', KEYS[1], 'NX', string.format(fmt, due / unit), m)
    -- The lost attempt counts, so the next claim numbers its attempt 2,
    -- and from now on the due time is kept beside the count, as for a
    -- retried member.
    redis.call('HSETNX', KEYS[4], m, 1)
    redis.call('HSETNX', KEYS[3], m, string.format('%.0f', due))
    recovered = recovered + 1
  end
  batched('ZREM', KEYS[2], expired, 1)
  -- A record that names an expired member belongs to a claim whose process
  -- died or stalled: its members still in flight get their due time beside
  -- them, as recovered members do, and the record goes. A record none of
  -- whose members is in flight any more goes too.
  for id, list in pairs(lists) do
    local named = false
    local members = {}
    for k = 1, #list, 2 do
      members[#members + 1] = list[k]
      if gone[list[k]] then named = true end
    end
    local alive = false
    for i = 1, #members, CHUNK do
      local j = math.min(#members, i + CHUNK - 1)
      local scores = redis.call('ZMSCORE', KEYS[2], unpack(members, i, j))
      for k, sc in ipairs(scores) do
        if sc then
          alive = true
          local m = members[i + k - 1]
          if named and newest[m] == id then
            redis.call('HSETNX', KEYS[3], m, list[2 * (i + k - 1)])
          end
        end
      end
    end
    if named or not alive then redis.call('HDEL', KEYS[5], id) end
  end
end

local out = {now, -1, recovered, ''}
local claimed = 0
if limit > 0 then
  local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format(fmt, now / unit),
    'WITHSCORES', 'LIMIT', 0, limit)
  claimed = #items / 2
  if claimed > 0 then
    -- Numbers handed to redis.call are printed with printf, which showed up
    -- as the largest share of Redis's time in a drain: the deadline is
    -- printed once, and due times pass through as the strings Redis gave.
    local deadline = string.format('%.0f', now + lease)
    local members, leased = {}, {}
    for i = 1, #items, 2 do
      members[#members + 1] = items[i]
      leased[#leased + 1] = deadline
      leased[#leased + 1] = items[i]
    end
    -- A retried, released or recovered member keeps the due time of its
    -- first claim, so its message_id and lateness stay those of the
    -- original schedule. Such a member always has an attempts entry, so
    -- while that hash is empty (no retries: the common case) nothing needs
    -- to be read back.
    local dues, attempts = {}, {}
    if redis.call('EXISTS', KEYS[4]) == 1 then
      for i = 1, #members, CHUNK do
        local j = math.min(#members, i + CHUNK - 1)
        local d = redis.call('HMGET', KEYS[3], unpack(members, i, j))
        local a = redis.call('HMGET', KEYS[4], unpack(members, i, j))
        for k = 1, #d do
          dues[i + k - 1] = d[k]
          attempts[i + k - 1] = a[k]
        end
      end
    end
    local new_dues, new_attempts = {}, {}
    for i, m in ipairs(members) do
      local due = dues[i]
      if not (due and tonumber(due)) then
        local score = items[2 * i]
        if unit == 1 and string.find(score, '^%d+$') then
          -- An integral score in ms is already its due time, as digits.
          due = score
        else
          -- A negative or -inf score is due at once; clamp it to stay an integer.
          due = string.format('%.0f', math.max(0, math.floor(tonumber(score) * unit)))
        end
        new_dues[#new_dues + 1] = m
        new_dues[#new_dues + 1] = due
      elseif not string.find(due, '^%d+$') then
        due = string.format('%.0f', math.max(0, math.floor(tonumber(due))))
      end
      local attempt = (tonumber(attempts[i]) or 0) + 1
      if attempt > 1 then
        new_attempts[#new_attempts + 1] = m
        new_attempts[#new_attempts + 1] = attempt
      end
      out[#out + 1] = m
      out[#out + 1] = due
      out[#out + 1] = attempt
    end
    -- The claimed members are exactly ranks 0..claimed-1 of K, so removing
    -- by rank spares Redis a lookup of every member.
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, claimed - 1)
    batched('ZADD', KEYS[2], leased, 2)
    -- One record per claim instead of one hash field per member: the due
    -- times are needed only if this claim's process dies, and writing and
    -- deleting a field per member was a quarter of Redis's work per message.
    if #new_dues > 0 then
      out[4] = string.format('%.0f', now) .. ':' .. ARGV[5]
      redis.call('HSET', KEYS[5], out[4], cmsgpack.pack(new_dues))
    end
    if #new_attempts > 0 then batched('HSET', KEYS[4], new_attempts, 2) end
  end
end

if claimed < limit or limit == 0 then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #head > 0 then
    local next_due = tonumber(head[2]) * unit
    -- Integer replies are truncated by Redis: clamp far-future and +inf
    -- scores to a value that still means "not soon".
    if next_due > 9e15 then next_due = 9e15 end
    if next_due < -9e15 then next_due = -9e15 end
    out[2] = math.ceil(next_due)
  end
end
return out
