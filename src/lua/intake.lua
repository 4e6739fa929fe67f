-- intake.lua: store messages taken from an intake queue (id mode): each
-- id's envelope in the body hash and the id in K at its due time (or in the
-- dead set with its reason), together, so no claim ever sees an id without
-- its body.
-- An id whose body hash entry holds the same envelope is a re-publish of
-- the same message (or the broker's redelivery of one delayd already
-- stored): absorbed, its schedule unchanged. An id that holds another
-- envelope names a different message: it is stored too, under the id
-- followed by '#' and 16 hex digits of the envelope's SHA-1, so that both
-- are delivered and a redelivery of the second is absorbed in turn.
-- An absorbed envelope is written again, unchanged: every call then sends
-- the replicas a write, so a WAIT that follows it on the same connection
-- waits for the stored copy too, even where an earlier call stored it over
-- another connection (a retry after a reconnection).
-- A call whose write is waited for by replicas (WAIT after it) names a
-- marker key, written with the messages: when too few replicas answer, the
-- call is run again, and finding its marker it only refreshes it (a write
-- for the next WAIT to wait for, which the replicas can hold only after
-- the first) and stores nothing: a message due meanwhile may have been
-- delivered and deleted, and storing it again would deliver it again.
-- Without its marker (a failover to a replica that never had the write,
-- or the marker expired) the call stores as if for the first time.
-- On a business with tenants each message goes into its tenant's set, and
-- the tenant into the index at its earliest due time (ZADD LT), as
-- producers on the ZADD road write them (docs/tenants.md).
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (task id -> envelope)
-- KEYS[3] dead ZSET {K}:dead (score = when it died, epoch ms)
-- KEYS[4] reasons HASH {K}:reasons (task id -> why it died)
-- KEYS[5] the tenant index ZSET {K}:tenants, when ARGV[3] > 0
-- KEYS[6] .. KEYS[5 + n] the tenants' sets ZSET {K}:tenant:<t>, n = ARGV[3]
-- KEYS[#KEYS] after those: marker STRING {K}:intake:<call token>; absent
--         for a call no replica wait follows (no marker)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2] the marker's time to live, ms
-- ARGV[3] n, how many tenants the messages name (0: every message in K)
-- ARGV[4] .. ARGV[3 + n] the tenants' names, as the index holds them
-- then four values per message: the id; when it is due: '0' (now),
--         '+<ms>' (this long after now), '@<ms>' (at this epoch ms, now if
--         past), or '!<reason>' (straight to the dead set, never
--         published); the envelope; its tenant, i for the i-th of ARGV[4..]
--         (0: K)
-- Returns {Redis's clock when it stored them (epoch ms), messages absorbed
-- as re-publishes, messages stored under a derived id} (0 and 0 when the
-- marker was found). Due times are on that clock, like every claim's
-- "now", and never past 2^53 ms.
local n = tonumber(ARGV[3])
local err = wrong_type(KEYS[1]) or wrong_type(KEYS[3])
  or (n > 0 and wrong_type(KEYS[5]))
if err then return err end
local now = now_ms()
local first_key = 5
if n > 0 then first_key = 6 + n end
local marker, ttl = KEYS[first_key], ARGV[2]
if marker and redis.call('PEXPIRE', marker, ttl) == 1 then
  return {now, 0, 0}
end
local unit = tonumber(ARGV[1])
local LATEST = 9007199254740992
local CHUNK = 1000
-- Per destination (0: K, i: the i-th tenant): score, member, ...
local scores = {[0] = {}}
local earliest = {}
for t = 1, n do scores[t] = {} end
local absorbed, renamed = 0, 0

-- Stores `envelope` under `id`, or under the derived id when `id` holds
-- another message; nil when the same message is there already.
local function store(id, envelope)
  if redis.call('HSETNX', KEYS[2], id, envelope) == 1 then
    return id
  end
  if redis.call('HGET', KEYS[2], id) == envelope then
    absorbed = absorbed + 1
    redis.call('HSET', KEYS[2], id, envelope)
    return nil
  end
  local derived = id .. '#' .. string.sub(redis.sha1hex(envelope), 1, 16)
  if redis.call('HSETNX', KEYS[2], derived, envelope) == 0 then
    absorbed = absorbed + 1
    redis.call('HSET', KEYS[2], derived, envelope)
    return nil
  end
  renamed = renamed + 1
  return derived
end

for i = 4 + n, #ARGV, 4 do
  local when = ARGV[i + 1]
  local t = tonumber(ARGV[i + 3]) or 0
  local id = store(ARGV[i], ARGV[i + 2])
  local sign, rest = string.sub(when, 1, 1), string.sub(when, 2)
  if id and sign == '!' then
    redis.call('ZADD', KEYS[3], now, id)
    redis.call('HSET', KEYS[4], id, rest)
  elseif id then
    local due = now
    local ms = tonumber(rest)
    if sign == '+' and ms then
      due = now + ms
    elseif sign == '@' and ms then
      due = math.max(now, ms)
    end
    due = math.min(due, LATEST)
    local score = score_of(due, unit)
    local list = scores[t]
    list[#list + 1] = score
    list[#list + 1] = id
    if t > 0 and (earliest[t] == nil or score < earliest[t]) then
      earliest[t] = score
    end
  end
end
for t = 0, n do
  local list, key = scores[t], KEYS[1]
  if t > 0 then key = KEYS[5 + t] end
  for i = 1, #list, CHUNK * 2 do
    local j = math.min(#list, i + CHUNK * 2 - 1)
    redis.call('ZADD', key, unpack(list, i, j))
  end
  if t > 0 and earliest[t] then
    redis.call('ZADD', KEYS[5], 'LT', earliest[t], ARGV[3 + t])
  end
end
if marker then
  redis.call('SET', marker, '1', 'PX', ttl)
end
return {now, absorbed, renamed}
