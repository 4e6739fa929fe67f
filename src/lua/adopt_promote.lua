-- adopt_promote.lua: settle staged messages (adopt_stage.lua) once their
-- plugin entries are deleted. Each promoted one becomes pending, together
-- with a record of the plugin entry it came from, so that a rerun after a
-- crash knows what it already moved, even once that message has been
-- delivered and its body is gone. Dropped ones (the plugin delivered them
-- itself) just leave the staging keys.
-- A promoted message is stored under its preferred id (the producer's
-- message_id, or the entry's own name when it had none); when that id holds
-- another message already, under the id followed by '#' and the first 16
-- hex digits of the entry's name, so two plugin entries with one
-- message_id are both delivered, as the plugin would have. An entry not
-- staged (promoted or dropped before) is left alone, and so is one whose
-- staged value is not a packed message (written by something else), as
-- staging.rs's reads skip it.
-- KEYS[1] pending ZSET K (score = due, in score units)
-- KEYS[2] body HASH (task id -> envelope)
-- KEYS[3] adopted HASH {K}:adopted (plugin entry name -> task id)
-- KEYS[4] staged HASH {K}:staged (plugin entry name -> packed message, as
--         adopt_stage.lua describes it)
-- ARGV[1] milliseconds per score unit (1 or 1000)
-- ARGV[2] how long to keep the adopted hash after this call, ms
-- ARGV[3] how many of the names that follow to promote (N)
-- ARGV[4] .. ARGV[3 + N]: entries to promote; the rest: entries to drop
-- Returns {Redis's clock when it stored them (epoch ms), messages promoted,
-- messages dropped}.
local err = wrong_type(KEYS[1])
if err then return err end
local now = now_ms()
local unit = tonumber(ARGV[1])
local last = 3 + tonumber(ARGV[3])
local LATEST = 9007199254740992
local promoted, dropped = 0, 0

for i = 4, #ARGV do
  local entry = ARGV[i]
  local packed = redis.call('HGET', KEYS[4], entry) or ''
  local due, id_len, node_len, ref_len, at =
    string.match(packed, '^(%d+) (%d+) (%d+) (%d+) ()')
  if due and i > last then
    redis.call('HDEL', KEYS[4], entry)
    dropped = dropped + 1
  elseif due then
    redis.call('HDEL', KEYS[4], entry)
    local id = string.sub(packed, at, at + id_len - 1)
    local envelope = string.sub(packed, at + id_len + node_len + ref_len)
    if redis.call('HSETNX', KEYS[2], id, envelope) == 0 then
      id = id .. '#' .. string.sub(entry, 1, 16)
      redis.call('HSET', KEYS[2], id, envelope)
    end
    due = math.min(math.max(now, tonumber(due)), LATEST)
    redis.call('ZADD', KEYS[1], score_of(due, unit), id)
    redis.call('HSET', KEYS[3], entry, id)
    promoted = promoted + 1
  end
end
if promoted > 0 then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return {now, promoted, dropped}
