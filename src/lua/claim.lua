-- claim.lua: recover expired leases, then claim due members, atomically.
-- The clock is Redis's own TIME, so every instance agrees on "due".
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] in-flight ZSET (score = lease deadline ms + tag/1024: the
--         fraction names the claim that holds the member, see below)
-- KEYS[3] meta HASH (member -> "attempts:due_ms:score": the attempts made
--         and the original due time of a member that was retried, released
--         or recovered, and the score delayd gave it in K; a member whose
--         score in K differs was re-added by a producer and starts afresh)
-- KEYS[4] claims HASH ("<claim ms>:<tag>" -> msgpack list {m1, due1, ...}
--         of the first attempts of one claim, read only to recover them)
-- KEYS[5] body HASH (id mode: task id -> body)
-- KEYS[6] delivered ZSET (id mode with a dedup window: id -> delivered at, ms)
-- KEYS[7] dead ZSET, KEYS[8] dead-reason HASH
-- KEYS[9] paused STRING: while it exists, expired leases are recovered but
--         nothing is claimed (an operator paused the business)
-- ARGV[1] most members to claim (>= 0)
-- ARGV[2] lease, ms
-- ARGV[3] milliseconds per score unit (1 or 1000)
-- ARGV[4] most expired leases to recover in this call
-- ARGV[5] a random claim tag, 1..1023
-- ARGV[6] '1' in id mode (members are ids, bodies in KEYS[5]), '2' in id
--         mode where bodies are intake envelopes (a dedup record names an
--         id with its content, see dedup_name in prelude.lua), else '0'
-- ARGV[7] dedup window ms (id mode; 0 for none)
-- ARGV[8] most bytes of members (and, in id mode, bodies) to claim; at
--         least one member is claimed however large (0 for no bound)
-- ARGV[9] max attempts: a recovered member whose expired lease was its
--         last allowed attempt goes to the dead set, reason 'lease expired
--         after N attempts', instead of back to K (0 for no bound)
-- Returns {now_ms, next_due_ms or -1, recovered, record id or '', tag,
-- dead for want of a body, dropped as delivered within the window,
-- dead because their lease kept expiring, paused (1 or 0), m1, due1, attempt1, m2, ...}, and in id mode each member's body after
-- its attempt (m1, due1, attempt1, body1, ...); each due is an integer or
-- its decimal digits. In id mode a member with no body is never leased:
-- it goes to the dead set with the reason 'no body'; one delivered within
-- the window is dropped with its body. Members are bulk strings, so an empty member is a member, never
-- "nothing due". The caller settles each member with the returned tag: a
-- settle write acts only on members whose in-flight fraction is that tag,
-- so a write that is repeated, or that arrives after the lease expired and
-- another claim took the member, changes nothing.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local unit = tonumber(ARGV[3])
local tag = tonumber(ARGV[5])
local id_mode = ARGV[6] ~= '0'
local by_content = ARGV[6] == '2'
local window = tonumber(ARGV[7]) or 0
local max_bytes = tonumber(ARGV[8]) or 0
local max_attempts = tonumber(ARGV[9]) or 0
-- Lua's unpack is bounded by the C stack; stay well below it.
local CHUNK = 1000

local function batched(cmd, key, list, per)
  for i = 1, #list, CHUNK * per do
    local j = math.min(#list, i + CHUNK * per - 1)
    redis.call(cmd, key, unpack(list, i, j))
  end
end

-- How many of the first n members fit in max_bytes (at least one): a reply
-- too large to read before the client's timeout would leave its members in
-- flight, recovered and claimed again, for ever.
local function fitting(n, size_of)
  if max_bytes <= 0 then return n end
  local total = 0
  for i = 1, n do
    total = total + size_of(i)
    if total > max_bytes and i > 1 then return i - 1 end
  end
  return n
end


local recovered, dead_expired = 0, 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
if #expired > 0 then
  local members, tags, metas, need = {}, {}, {}, {}
  for i = 1, #expired, 2 do
    local m = expired[i]
    members[#members + 1] = m
    tags[#tags + 1] = tag_of(expired[i + 1])
    local a, d = parse_meta(redis.call('HGET', KEYS[3], m))
    metas[#metas + 1] = a and {a, d} or false
    if not a then need[tags[#tags]] = true end
  end
  -- First attempts keep their due time in their claim's record. Only the
  -- records with the tags of expired first attempts are read; the newest
  -- one that names a member is the claim that held it.
  local dues, from, read = {}, {}, {}
  if next(need) then
    local ids = redis.call('HKEYS', KEYS[4])
    local wanted = {}
    for _, id in ipairs(ids) do
      local ms, tg = string.match(id, '^(%d+):(%d+)$')
      if ms and need[tonumber(tg)] then wanted[#wanted + 1] = id end
    end
    for i = 1, #wanted, CHUNK do
      local j = math.min(#wanted, i + CHUNK - 1)
      local vals = redis.call('HMGET', KEYS[4], unpack(wanted, i, j))
      for k, v in ipairs(vals) do
        if v then
          local id = wanted[i + k - 1]
          local ms, tg = string.match(id, '^(%d+):(%d+)$')
          ms, tg = tonumber(ms), tonumber(tg)
          local list = cmsgpack.unpack(v)
          read[#read + 1] = {id, tg, list}
          for x = 1, #list, 2 do
            local key = list[x] .. '\0' .. tg
            if not from[key] or from[key] < ms then
              from[key] = ms
              dues[key] = list[x + 1]
            end
          end
        end
      end
    end
  end
  for i, m in ipairs(members) do
    local attempts, due
    if metas[i] then
      attempts, due = metas[i][1], metas[i][2]
    else
      -- The lost attempt counts, so the next claim numbers its attempt 2.
      attempts, due = 1, dues[m .. '\0' .. tags[i]]
    end
    due = tonumber(due) or now
    local score = score_of(due, unit)
    if max_attempts > 0 and attempts >= max_attempts and not redis.call('ZSCORE', KEYS[1], m) then
      -- Its lease keeps expiring (a member too large to read in time, a
      -- process that dies on it): it stops here, with why.
      redis.call('ZADD', KEYS[7], now, m)
      redis.call('HSET', KEYS[8], m, 'lease expired after ' .. attempts .. ' attempts')
      redis.call('HDEL', KEYS[3], m)
      dead_expired = dead_expired + 1
    -- NX: a producer that rescheduled the member meanwhile wins, and its
    -- copy starts afresh.
    elseif redis.call('ZADD', KEYS[1], 'NX', score, m) == 1 then
      redis.call('HSET', KEYS[3], m, meta_value(attempts, due, score))
    else
      redis.call('HDEL', KEYS[3], m)
    end
    recovered = recovered + 1
  end
  batched('ZREM', KEYS[2], members, 1)
  -- A record read here whose claim holds none of its members any more (its
  -- process died, or its reply was lost) goes now rather than at the next
  -- sweep.
  for _, r in ipairs(read) do
    local id, tg, list = r[1], r[2], r[3]
    local names = {}
    for x = 1, #list, 2 do names[#names + 1] = list[x] end
    local held = false
    for i = 1, #names, CHUNK do
      local j = math.min(#names, i + CHUNK - 1)
      for _, sc in ipairs(redis.call('ZMSCORE', KEYS[2], unpack(names, i, j))) do
        if sc and tag_of(sc) == tg then held = true; break end
      end
      if held then break end
    end
    if not held then redis.call('HDEL', KEYS[4], id) end
  end
end

local out = {now, -1, recovered, '', tag, 0, 0, dead_expired, 0}
if redis.call('EXISTS', KEYS[9]) == 1 then
  limit = 0
  out[9] = 1
end
local claimed = 0
if limit > 0 then
  local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', score_of(now, unit),
    'WITHSCORES', 'LIMIT', 0, limit)
  claimed = #items / 2
  if not id_mode then
    claimed = fitting(claimed, function(i) return #items[2 * i - 1] end)
  end
  if claimed > 0 then
    -- A claim id must not name a live record: move to the next tag if it does.
    local id = record_id(now, tag)
    for _ = 1, 1023 do
      if redis.call('HEXISTS', KEYS[4], id) == 0 then break end
      tag = tag % 1023 + 1
      id = record_id(now, tag)
    end
    out[5] = tag
    -- Numbers handed to redis.call are printed with printf, which showed up
    -- as the largest share of Redis's time in a drain: the deadline is
    -- printed once, and due times pass through as the strings Redis gave.
    local deadline = inflight_score(now + lease, tag)
    local members, leased = {}, {}
    for i = 1, 2 * claimed, 2 do
      members[#members + 1] = items[i]
    end
    -- Id mode: the bodies travel with the claim, read in the same call, so
    -- no member is ever published without its body or with another's.
    local bodies, drop = {}, {}
    if id_mode then
      for i = 1, #members, CHUNK do
        local j = math.min(#members, i + CHUNK - 1)
        local v = redis.call('HMGET', KEYS[5], unpack(members, i, j))
        for k = 1, #v do bodies[i + k - 1] = v[k] end
      end
      claimed = fitting(claimed, function(i)
        return #members[i] + (bodies[i] and #bodies[i] or 0)
      end)
      for i = claimed + 1, #members do
        members[i], bodies[i] = nil, nil
      end
      if window > 0 and redis.call('EXISTS', KEYS[6]) == 1 then
        local names = members
        if by_content then
          names = {}
          for i, m in ipairs(members) do names[i] = dedup_name(m, bodies[i]) end
        end
        for i = 1, #members, CHUNK do
          local j = math.min(#members, i + CHUNK - 1)
          local v = redis.call('ZMSCORE', KEYS[6], unpack(names, i, j))
          for k = 1, #v do
            if v[k] and tonumber(v[k]) > now - window then drop[i + k - 1] = 'dedup' end
          end
        end
      end
      local gone, dead = {}, {}
      for i, m in ipairs(members) do
        if not drop[i] and not bodies[i] then drop[i] = 'no body' end
        if drop[i] == 'dedup' then
          gone[#gone + 1] = m
          out[7] = out[7] + 1
        elseif drop[i] then
          dead[#dead + 1] = now
          dead[#dead + 1] = m
          redis.call('HSET', KEYS[8], m, 'no body')
          out[6] = out[6] + 1
        end
      end
      if #gone > 0 then batched('HDEL', KEYS[5], gone, 1) end
      if #dead > 0 then batched('ZADD', KEYS[7], dead, 2) end
    end
    for i, m in ipairs(members) do
      if not drop[i] then
        leased[#leased + 1] = deadline
        leased[#leased + 1] = m
      end
    end
    -- A member with a meta entry keeps its first due time and attempt count,
    -- so its message_id and lateness stay those of the original schedule.
    -- While that hash is empty (no retries: the common case) nothing needs
    -- to be read back.
    local metas = {}
    if redis.call('EXISTS', KEYS[3]) == 1 then
      for i = 1, #members, CHUNK do
        local j = math.min(#members, i + CHUNK - 1)
        local v = redis.call('HMGET', KEYS[3], unpack(members, i, j))
        for k = 1, #v do metas[i + k - 1] = v[k] end
      end
    end
    local new_dues, new_meta, stale = {}, {}, {}
    for i, m in ipairs(members) do
      local score = items[2 * i]
      local a, d, s = parse_meta(metas[i])
      local due, attempt
      if drop[i] then
        -- Never leased: whatever retry state it had is stale now.
        if metas[i] then stale[#stale + 1] = m end
      elseif a and s ~= '' and tonumber(s) == tonumber(score) then
        due, attempt = d, a + 1
        new_meta[#new_meta + 1] = m
        new_meta[#new_meta + 1] = meta_value(attempt, d, '')
      else
        if metas[i] then stale[#stale + 1] = m end
        if unit == 1 and string.find(score, '^%d+$') then
          -- An integral score in ms is already its due time, as digits.
          due = score
        else
          -- A negative or -inf score is due at once; clamp it to stay an integer.
          due = string.format('%.0f', math.max(0, math.floor(tonumber(score) * unit)))
        end
        attempt = 1
        new_dues[#new_dues + 1] = m
        new_dues[#new_dues + 1] = due
      end
      if not drop[i] then
        out[#out + 1] = m
        out[#out + 1] = due
        out[#out + 1] = attempt
        if id_mode then out[#out + 1] = bodies[i] end
      end
    end
    -- The claimed members are exactly ranks 0..claimed-1 of K, so removing
    -- by rank spares Redis a lookup of every member.
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, claimed - 1)
    if #leased > 0 then batched('ZADD', KEYS[2], leased, 2) end
    -- One record per claim instead of one hash field per member: the due
    -- times are needed only if this claim's process dies, and writing and
    -- deleting a field per member was a quarter of Redis's work per message.
    if #new_dues > 0 then
      out[4] = id
      redis.call('HSET', KEYS[4], id, cmsgpack.pack(new_dues))
    end
    if #new_meta > 0 then batched('HSET', KEYS[3], new_meta, 2) end
    if #stale > 0 then batched('HDEL', KEYS[3], stale, 1) end
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
