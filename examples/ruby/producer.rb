# A delayd producer in Ruby with redis-rb: body mode and id mode.
#
# Run by tests/examples.rs against the daemon the suite builds; see
# examples/README.md for what it writes and docs/wire-format.md for why.
#
# Environment: REDIS_URL, BODY_KEY (a body-mode business's key), ID_KEY (an
# id-mode business's key), DUE_MS (epoch ms the tasks are due at).
require "redis"

redis = Redis.new(url: ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379/0"))
BODY_KEY = ENV.fetch("BODY_KEY", "delay:order:expire")
ID_KEY = ENV.fetch("ID_KEY", "delay:order:timeout")
DUE_MS = Integer(ENV.fetch("DUE_MS"))

# {K}:suffix, or K:suffix when K already has a {hash tag}.
def helper_key(key, suffix)
  open = key.index("{")
  close = open && key.index("}", open + 1)
  close && close > open + 1 ? "#{key}:#{suffix}" : "{#{key}}:#{suffix}"
end

BODIES = helper_key(ID_KEY, "body")

# Removes a pending task and its body; leaves an in-flight one alone.
CANCEL = <<~LUA
  if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[1])
    return 1
  end
  return 0
LUA

# Schedules a task, or replaces its body and due time: one MULTI.
def schedule(redis, id, body, due_ms)
  redis.multi do |tx|
    tx.hset(BODIES, id, body)
    tx.zadd(ID_KEY, due_ms, id)
  end
end

# Moves a pending task; false when it is not pending any more.
def reschedule(redis, id, due_ms)
  _, score = redis.multi do |tx|
    tx.zadd(ID_KEY, due_ms, id, xx: true)
    tx.zscore(ID_KEY, id)
  end
  !score.nil?
end

# Cancels a pending task and drops its body; false when not pending.
def cancel(redis, id)
  redis.eval(CANCEL, keys: [ID_KEY, BODIES], argv: [id]) == 1
end

# Body mode: the member is the message.
redis.zadd(BODY_KEY, DUE_MS, '{"order":41,"action":"expire"}')
redis.zadd(BODY_KEY, DUE_MS + 3_600_000, '{"order":40,"action":"expire"}')
redis.zrem(BODY_KEY, '{"order":40,"action":"expire"}')

# Id mode: the member is a task id, the body beside it.
schedule(redis, "order-42", '{"order":42,"action":"expire"}', DUE_MS)
schedule(redis, "order-43", '{"order":43,"action":"expire"}', DUE_MS + 3_600_000)
schedule(redis, "order-44", '{"order":44,"action":"expire"}', DUE_MS + 3_600_000)
raise "order-43 not pending" unless reschedule(redis, "order-43", DUE_MS + 1)
raise "order-44 not cancelled" unless cancel(redis, "order-44")
raise "order-44 still pending" if reschedule(redis, "order-44", DUE_MS)
redis.close
