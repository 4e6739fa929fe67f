-- adopt_stage.lua: stage messages read from the delayed-message plugin,
-- before the plugin's entries are deleted. A staged message is not pending:
-- nothing delivers it until adopt_promote.lua moves it into K, so a plugin
-- that runs again with the entry (a broker restart while an adoption is
-- interrupted) is then its only sender.
-- An entry already recorded in the adopted hash was moved by an earlier run
-- and is not staged again ("already there"); staging one again (a rerun
-- read it from the plugin once more) writes the same value.
-- KEYS[1] staged HASH {K}:staged (plugin entry name -> packed message)
-- KEYS[2] adopted HASH {K}:adopted (plugin entry name -> task id)
-- ARGV[1] how long to keep the staged hash after this call, ms
-- ARGV[2], ARGV[3], ... two values per message: the entry's name (32 hex
--         digits); the packed message ("<due ms> <id length> <node length>
--         <ref length> " then the id, the node, the ref and the envelope)
-- Returns {Redis's clock (epoch ms), messages staged, messages already there}.
local staged, already = 0, 0

for i = 2, #ARGV, 2 do
  local entry = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], entry) == 1 then
    already = already + 1
  else
    redis.call('HSET', KEYS[1], entry, ARGV[i + 1])
    staged = staged + 1
  end
end
if staged > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {now_ms(), staged, already}
