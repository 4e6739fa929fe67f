-- body_search.lua: one bounded step of a search by payload in id mode:
-- HSCAN the body hash from a cursor and keep only the ids whose body
-- contains the text, so only matches cross the network, each cut to a
-- bounded size: a reply is at most (matches) x (ARGV[4] + id) bytes, and
-- the matches at most the members HSCAN looked at.
-- KEYS[1] body HASH ({K}:body: task id -> body)
-- ARGV[1] HSCAN cursor ('0' to start), ARGV[2] COUNT hint (members looked
-- at), ARGV[3] the text to find (plain bytes, no pattern), ARGV[4] most
-- bytes of each matching body returned (its start)
-- Returns {next cursor, bodies looked at, their bytes in all, id1, size1,
-- head1, id2, size2, head2, ...}: each match's id, its body's full size in
-- bytes and the body's first ARGV[4] bytes. The caller sizes its next
-- COUNT from the bytes looked at.
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local cut = tonumber(ARGV[4])
local out = {r[1], 0, 0}
local kv = r[2]
local bytes = 0
for i = 1, #kv, 2 do
  local body = kv[i + 1]
  bytes = bytes + #body
  if string.find(body, ARGV[3], 1, true) then
    out[#out + 1] = kv[i]
    out[#out + 1] = #body
    out[#out + 1] = string.sub(body, 1, cut)
  end
end
out[2] = #kv / 2
out[3] = bytes
return out
