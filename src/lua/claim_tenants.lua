-- claim_tenants.lua: the claim of a business with tenants. Moves the due
-- members delayd's fair share chose (src/tenants/share.rs) from their
-- tenants' sorted sets into K, then runs claim.lua unchanged on K, then
-- reports which tenants have due work for the next choice, atomically.
-- src/redis_conn/scripts.rs builds it as prelude.lua, this file, claim.lua
-- as the body of `local function claim()`, and `return fair_claim(claim)`.
-- KEYS[1..9] as claim.lua (K, in-flight, meta, claims, body, delivered,
--          dead, dead-reason, paused)
-- KEYS[10] tenant index ZSET (tenant -> due score of its earliest member)
-- KEYS[11] virtual time HASH (tenant -> virtual time, while backlogged)
-- KEYS[12] paused tenants HASH (tenant -> "<since ms> <by>"): none of their
--          members moves, and they are neither reported nor a next due time
-- KEYS[13] weights set at run time HASH (tenant -> weight, 1 to 1000):
--          each replaces the weight ARGV or the config gives
-- KEYS[14] release budgets HASH (tenant with a max_rate -> the time, µs on
--          Redis's clock, at which its budget is full again; GCRA as
--          rate.lua): gone while full
-- KEYS[15] released HASH (tenant -> "<second> <moved in it> <moved in the
--          second before>", seconds of Redis's clock): each tenant's
--          released rate, for the listing; gone with its set
-- KEYS[16] max_rates set at run time HASH (tenant -> members a second):
--          reported, for delayd to size the tenant's budget in ARGV from
--          the next claim on
-- KEYS[17..] the sets of the tenants named in the triples, in that order
-- ARGV[1..9] as claim.lua
-- ARGV[10] the prefix of tenant set names ("{K}:tenant:"): the tenants
--          reported are read under it (same cluster slot as K)
-- ARGV[11] most tenants with due work to report
-- ARGV[12] virtual time floor: a tenant without a virtual time, or with
--          one below it, starts from it (no credit is banked while idle)
-- ARGV[13] R, the number of tenants with a max_rate, then R triples:
--          tenant, µs between two releases (1e6 / its max_rate), releases
--          its budget holds when full
-- ARGV[14 + 3R..] quadruples: tenant, most members to move (with a '+'
--          after it, "and what fell due since": the share gave it all it
--          had due, so it moves every due member, within the room, its
--          bound and its budget), weight (>= 1),
--          most it may move in all ('' for no bound; '0' holds it back:
--          at its cap of unconfirmed publishes on the instance asking, it
--          moves nothing and is no next due time, as if paused)
-- Returns claim.lua's reply with two arrays appended: the tenant each
-- claimed member was moved from in this call ('' for a member already in
-- K), in the reply's order; then {tenant1, due1,
-- vtime1 or '', weight1 or '', max_rate1 or '', tenant2, ...} for the
-- first ARGV[11] tenants in the index, not paused, whose earliest member
-- is due, each with its count of due members and its run-time weight and
-- max_rate. Its next due
-- time (out[2]) is the earlier of K's head and the earliest head of a
-- tenant not paused, a tenant at its max_rate counting from when its
-- budget holds half a burst again.
-- Tenants due but not named in ARGV (due since the last report) first move
-- one member each, then the named ones their counts, then the named ones
-- without a max_rate what room is left (a share a capped tenant could not
-- use goes to the others). A tenant with a max_rate moves no more than its
-- budget holds (ARGV gives its size when full), whichever
-- instance claims.
-- Members move at most until K holds ARGV[1] due members, never early, in
-- due order within a tenant; a moved member keeps its score, so claim.lua
-- leases it exactly as a member written to K. Index entries of tenants left
-- with no member (claimed, cancelled) are removed, others set to their head.

local function fair_claim(claim)
  for _, key in ipairs({KEYS[1], KEYS[10]}) do
    local err = wrong_type(key)
    if err then return err end
  end
  -- Paused tenants and run-time weights cost nothing while there are none.
  local paused_count = redis.call('HLEN', KEYS[12])
  local function paused(tenant)
    return paused_count > 0 and redis.call('HEXISTS', KEYS[12], tenant) == 1
  end
  local weighted = redis.call('EXISTS', KEYS[13]) == 1
  local function set_weight(tenant)
    return weighted and redis.call('HGET', KEYS[13], tenant) or false
  end
  local rates_set = redis.call('EXISTS', KEYS[16]) == 1
  local function set_max_rate(tenant)
    return rates_set and redis.call('HGET', KEYS[16], tenant) or false
  end
  local now = now_ms()
  local unit = tonumber(ARGV[3])
  local top = score_of(now, unit)
  local floor = tonumber(ARGV[12]) or 0
  local rated = tonumber(ARGV[13])
  local intervals, bursts = {}, {}
  for i = 14, 13 + 3 * rated, 3 do
    intervals[ARGV[i]] = tonumber(ARGV[i + 1])
    bursts[ARGV[i]] = tonumber(ARGV[i + 2])
  end
  local first_take = 14 + 3 * rated
  -- The most each named tenant may move in all; held ones move nothing.
  local most, held, held_count = {}, {}, 0
  for i = first_take, #ARGV, 4 do
    most[ARGV[i]] = tonumber(ARGV[i + 3])
    if most[ARGV[i]] == 0 then
      held[ARGV[i]] = true
      held_count = held_count + 1
    end
  end
  local now_us = 0
  if rated > 0 then
    local clock = redis.call('TIME')
    now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  end

  -- A capped tenant's budget: how many it may release now, and when it
  -- holds half its burst again, the time to claim it next: a claim that
  -- comes a little late then finds the tokens that accrued meanwhile, not
  -- a full budget that stopped accruing.
  local function budget(tenant, interval)
    local burst = bursts[tenant]
    local full = tonumber(redis.call('HGET', KEYS[14], tenant)) or now_us
    if full < now_us then full = now_us end
    local free = math.floor((now_us + burst * interval - full) / interval + 1e-9)
    return math.max(0, free), full, full - math.floor(burst / 2) * interval
  end

  -- Counts n more released this second, keeping the second before's count.
  local second = math.floor(now / 1000)
  local function count_released(tenant, n)
    local s, c, p = 0, 0, 0
    local was = redis.call('HGET', KEYS[15], tenant)
    if was then
      local a, b, d = string.match(was, '^(%d+) (%d+) (%d+)$')
      s, c, p = tonumber(a) or 0, tonumber(b) or 0, tonumber(d) or 0
    end
    if s == second then
      c = c + n
    elseif s == second - 1 then
      s, c, p = second, n, c
    else
      s, c, p = second, n, 0
    end
    redis.call('HSET', KEYS[15], tenant, s .. ' ' .. c .. ' ' .. p)
  end

  -- The index names a tenant by its earliest member, or not at all.
  local function repair(set, tenant)
    local head = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if #head == 0 then
      redis.call('ZREM', KEYS[10], tenant)
      redis.call('HDEL', KEYS[11], tenant)
      redis.call('HDEL', KEYS[15], tenant)
    else
      redis.call('ZADD', KEYS[10], head[2], tenant)
    end
  end

  -- Members moved in this call, to the tenant each came from.
  local moved = {}

  -- Moves up to `want` of the tenant's due members into K, charging its
  -- virtual time n / weight; the number moved.
  local function move(set, tenant, want, weight)
    weight = tonumber(set_weight(tenant)) or weight
    local interval, full = intervals[tenant], nil
    if interval then
      local free
      free, full = budget(tenant, interval)
      if free < want then want = free end
      if want <= 0 then return 0 end
    end
    local items = redis.call('ZRANGEBYSCORE', set, '-inf', top, 'WITHSCORES', 'LIMIT', 0, want)
    local n = #items / 2
    if n > 0 then
      local adds = {}
      for j = 1, #items, 2 do
        adds[#adds + 1] = items[j + 1]
        adds[#adds + 1] = items[j]
        moved[items[j]] = tenant
      end
      for j = 1, #adds, 2000 do
        redis.call('ZADD', KEYS[1], unpack(adds, j, math.min(#adds, j + 1999)))
      end
      -- The moved members are exactly ranks 0..n-1 of the tenant's set.
      redis.call('ZREMRANGEBYRANK', set, 0, n - 1)
      local v = tonumber(redis.call('HGET', KEYS[11], tenant)) or floor
      if v < floor then v = floor end
      redis.call('HSET', KEYS[11], tenant, string.format('%.17g', v + n / weight))
      if interval then
        redis.call('HSET', KEYS[14], tenant, string.format('%.17g', full + n * interval))
      end
      count_released(tenant, n)
    end
    repair(set, tenant)
    return n
  end

  if redis.call('EXISTS', KEYS[9]) == 0 then
    local room = tonumber(ARGV[1]) - redis.call('ZCOUNT', KEYS[1], '-inf', top)
    -- Tenants that fell due since the last report are not in the request;
    -- fair queueing would serve them first (they start from the floor),
    -- so each gets one member now rather than a claim later, in the order
    -- of their earliest member. Their fair share follows from the report.
    local asked = {}
    for i = first_take, #ARGV, 4 do asked[ARGV[i]] = true end
    if room > 0 then
      local due = redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', top, 'LIMIT', 0, tonumber(ARGV[11]))
      for _, tenant in ipairs(due) do
        if room <= 0 then break end
        if not asked[tenant] and not paused(tenant) then
          local set = ARGV[10] .. tenant
          local err = wrong_type(set)
          if err then return err end
          room = room - move(set, tenant, 1, 1)
        end
      end
    end
    local taken = {}
    for pass = 1, 2 do
      for i = first_take, #ARGV, 4 do
        if room <= 0 then break end
        local set, tenant = KEYS[17 + (i - first_take) / 4], ARGV[i]
        if not paused(tenant) and not held[tenant] and (pass == 1 or not intervals[tenant]) then
          local err = wrong_type(set)
          if err then return err end
          local count, rest = string.match(ARGV[i + 1], '^(%d+)(%+?)$')
          local want = room
          if pass == 1 and rest == '' then want = math.min(tonumber(count), room) end
          local bound = most[tenant]
          if bound then want = math.min(want, bound - (taken[tenant] or 0)) end
          if want > 0 then
            local n = move(set, tenant, want, tonumber(ARGV[i + 2]))
            taken[tenant] = (taken[tenant] or 0) + n
            room = room - n
          end
        end
      end
      -- The second pass only hands on what a capped tenant left.
      if rated == 0 then break end
    end
  end

  local out = claim()
  if out.err then return out end
  local owners = {}
  local stride = ARGV[6] ~= '0' and 4 or 3
  for i = 10, #out, stride do owners[#owners + 1] = moved[out[i]] or '' end

  -- Read past the paused tenants, which stay in the index (producers go on
  -- writing it) but are never reported.
  local state = {}
  local tenants = redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', top, 'LIMIT', 0,
    tonumber(ARGV[11]) + paused_count)
  local reported = 0
  for _, tenant in ipairs(tenants) do
    if reported >= tonumber(ARGV[11]) then break end
    if not paused(tenant) then
      local set = ARGV[10] .. tenant
      local due = redis.call('ZCOUNT', set, '-inf', top)
      if due == 0 then
        -- Stale: its members were cancelled or rescheduled later.
        repair(set, tenant)
      else
        reported = reported + 1
        state[#state + 1] = tenant
        state[#state + 1] = due
        state[#state + 1] = redis.call('HGET', KEYS[11], tenant) or ''
        state[#state + 1] = set_weight(tenant) or ''
        state[#state + 1] = set_max_rate(tenant) or ''
      end
    end
  end
  -- The first head of a tenant neither paused, held nor capped bounds the
  -- next due time; a capped tenant counts from when its budget is full
  -- again. A held one is claimed again once its confirms come back.
  local head = redis.call('ZRANGE', KEYS[10], 0, paused_count + held_count + rated, 'WITHSCORES')
  local first
  for j = 1, #head, 2 do
    local tenant, at = head[j], tonumber(head[j + 1]) * unit
    if not paused(tenant) and not held[tenant] then
      local interval = intervals[tenant]
      if interval then
        local _, _, ready = budget(tenant, interval)
        if ready / 1000 > at then at = ready / 1000 end
      end
      if not first or at < first then first = at end
      if not interval then break end
    end
  end
  if first then
    local next_due = first
    if next_due > 9e15 then next_due = 9e15 end
    if next_due < -9e15 then next_due = -9e15 end
    next_due = math.ceil(next_due)
    if out[2] == -1 or next_due < out[2] then out[2] = next_due end
  end
  out[#out + 1] = owners
  out[#out + 1] = state
  return out
end
