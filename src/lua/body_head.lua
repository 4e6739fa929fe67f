-- body_head.lua: the start of one stored body and its full size, so a
-- look-up by id brings at most ARGV[2] bytes of it out of Redis however
-- large it is (HSTRLEN sizes it without a copy when it needs no cut).
-- KEYS[1] body HASH ({K}:body: task id -> body)
-- ARGV[1] the task id, ARGV[2] most bytes of the body returned (its start)
-- Returns {} when the id has no body, else {size in bytes, first ARGV[2]
-- bytes}.
local size = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if size == 0 and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {}
end
local body = redis.call('HGET', KEYS[1], ARGV[1])
return {size, string.sub(body, 1, tonumber(ARGV[2]))}
