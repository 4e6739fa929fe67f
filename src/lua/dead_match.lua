-- dead_match.lua: counts the dead members a requeue or purge would act on,
-- changing nothing, so a count never brings members out of Redis.
-- KEYS[1] dead ZSET, KEYS[2] dead-reason HASH
-- ARGV[1] most members to count, ARGV[2..] which members: as prelude.lua's
-- dead_picked reads them ('digest' score sha1; 'reason' text cursor...)
-- Returns step_reply's {n, ...}: n the number of members picked.
local members, last, last_score, more = dead_picked(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV, 2)
return step_reply(#members, last, last_score, more)
