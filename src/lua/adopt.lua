-- adopt.lua: store messages moved out of the delayed-message plugin (id
-- mode), each with a record of the plugin entry it came from, together, so
-- that a rerun after a crash knows what it already moved, even once that
-- message has been delivered and its body is gone.
-- An entry already recorded is skipped ("already there"). Otherwise the
-- message is stored under its preferred id (the producer's message_id, or
-- the entry's own name when it had none); when that id holds another
-- message already, under the id followed by '#' and the first 16 hex digits
-- of the entry's name, so two plugin entries with one message_id are both
-- delivered, as the plugin would have.
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (task id -> envelope)
-- KEYS[3] adopted HASH {K}:adopted (plugin entry name -> task id)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2] how long to keep the adopted hash after this call, ms
-- ARGV[3], ARGV[4], ARGV[5], ARGV[6], ... four values per message: the
--         entry's name (32 hex digits); the preferred id; when it is due,
--         epoch ms (now if past); the envelope
-- Returns {Redis's clock when it stored them (epoch ms), messages stored,
-- messages already there}.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local unit = tonumber(ARGV[1])
local LATEST = 9007199254740992
local moved, already = 0, 0

for i = 3, #ARGV, 4 do
  local entry, id, due, envelope = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  if redis.call('HEXISTS', KEYS[3], entry) == 1 then
    already = already + 1
  else
    if redis.call('HSETNX', KEYS[2], id, envelope) == 0 then
      id = id .. '#' .. string.sub(entry, 1, 16)
      redis.call('HSET', KEYS[2], id, envelope)
    end
    due = math.min(math.max(now, due or now), LATEST)
    redis.call('ZADD', KEYS[1], score_of(due, unit), id)
    redis.call('HSET', KEYS[3], entry, id)
    moved = moved + 1
  end
end
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return {now, moved, already}
