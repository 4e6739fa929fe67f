"""A delayd producer in Python with redis-py: body mode and id mode.

Run by tests/examples.rs against the daemon the suite builds; see
examples/README.md for what it writes and docs/wire-format.md for why.

Environment: REDIS_URL, BODY_KEY (a body-mode business's key), ID_KEY (an
id-mode business's key), DUE_MS (epoch ms the tasks are due at).
"""

import os

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
BODY_KEY = os.environ.get("BODY_KEY", "delay:order:expire")
ID_KEY = os.environ.get("ID_KEY", "delay:order:timeout")
DUE_MS = int(os.environ["DUE_MS"])


def helper_key(key, suffix):
    """{K}:suffix, or K:suffix when K already has a {hash tag}."""
    open_ = key.find("{")
    tagged = open_ >= 0 and key.find("}", open_ + 1) > open_ + 1
    return f"{key}:{suffix}" if tagged else f"{{{key}}}:{suffix}"


BODIES = helper_key(ID_KEY, "body")

# Removes a pending task and its body; leaves an in-flight one alone.
CANCEL = r.register_script("""
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
""")


def schedule(task_id, body, due_ms):
    """Schedules a task, or replaces its body and due time: one MULTI."""
    p = r.pipeline(transaction=True)
    p.hset(BODIES, task_id, body)
    p.zadd(ID_KEY, {task_id: due_ms})
    p.execute()


def reschedule(task_id, due_ms):
    """Moves a pending task; False when it is not pending any more."""
    p = r.pipeline(transaction=True)
    p.zadd(ID_KEY, {task_id: due_ms}, xx=True)
    p.zscore(ID_KEY, task_id)
    return p.execute()[1] is not None


def cancel(task_id):
    """Cancels a pending task and drops its body; False when not pending."""
    return CANCEL(keys=[ID_KEY, BODIES], args=[task_id]) == 1


# Body mode: the member is the message.
r.zadd(BODY_KEY, {b'{"order":41,"action":"expire"}': DUE_MS})
r.zadd(BODY_KEY, {b'{"order":40,"action":"expire"}': DUE_MS + 3_600_000})
r.zrem(BODY_KEY, b'{"order":40,"action":"expire"}')

# Id mode: the member is a task id, the body beside it.
schedule("order-42", b'{"order":42,"action":"expire"}', DUE_MS)
schedule("order-43", b'{"order":43,"action":"expire"}', DUE_MS + 3_600_000)
schedule("order-44", b'{"order":44,"action":"expire"}', DUE_MS + 3_600_000)
assert reschedule("order-43", DUE_MS + 1)
assert cancel("order-44")
assert not reschedule("order-44", DUE_MS)
