-- body_search.lua: one bounded step of a search by payload in id mode:
-- HSCAN the body hash from a cursor and keep only the ids whose body
-- contains the text, so only matches cross the network.
-- KEYS[1] body HASH ({K}:body: task id -> body)
-- ARGV[1] HSCAN cursor ('0' to start), ARGV[2] COUNT hint (members looked
-- at), ARGV[3] the text to find (plain bytes, no pattern)
-- Returns {next cursor, id1, body1, id2, body2, ...}.
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  if string.find(kv[i + 1], ARGV[3], 1, true) then
    out[#out + 1] = kv[i]
    out[#out + 1] = kv[i + 1]
  end
end
return out
