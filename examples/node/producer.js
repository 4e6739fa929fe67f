// A delayd producer in Node with ioredis: body mode and id mode.
//
// Run by tests/examples.rs against the daemon the suite builds; see
// examples/README.md for what it writes and docs/wire-format.md for why.
//
// Environment: REDIS_URL, BODY_KEY (a body-mode business's key), ID_KEY (an
// id-mode business's key), DUE_MS (epoch ms the tasks are due at).
"use strict";
const assert = require("assert");
const Redis = require("ioredis");

const redis = new Redis(process.env.REDIS_URL || "redis://127.0.0.1:6379/0");
const BODY_KEY = process.env.BODY_KEY || "delay:order:expire";
const ID_KEY = process.env.ID_KEY || "delay:order:timeout";
const DUE_MS = Number(process.env.DUE_MS);

// {K}:suffix, or K:suffix when K already has a {hash tag}.
function helperKey(key, suffix) {
  const open = key.indexOf("{");
  const tagged = open >= 0 && key.indexOf("}", open + 1) > open + 1;
  return tagged ? `${key}:${suffix}` : `{${key}}:${suffix}`;
}

const BODIES = helperKey(ID_KEY, "body");

// Removes a pending task and its body; leaves an in-flight one alone.
redis.defineCommand("cancelTask", {
  numberOfKeys: 2,
  lua: `if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
          redis.call('HDEL', KEYS[2], ARGV[1])
          return 1
        end
        return 0`,
});

// Schedules a task, or replaces its body and due time: one MULTI.
async function schedule(id, body, dueMs) {
  const replies = await redis.multi().hset(BODIES, id, body).zadd(ID_KEY, dueMs, id).exec();
  for (const [err] of replies) if (err) throw err;
}

// Moves a pending task; false when it is not pending any more.
async function reschedule(id, dueMs) {
  const [, [, score]] = await redis.multi().zadd(ID_KEY, "XX", dueMs, id).zscore(ID_KEY, id).exec();
  return score !== null;
}

// Cancels a pending task and drops its body; false when not pending.
async function cancel(id) {
  return (await redis.cancelTask(ID_KEY, BODIES, id)) === 1;
}

(async () => {
  // Body mode: the member is the message.
  await redis.zadd(BODY_KEY, DUE_MS, '{"order":41,"action":"expire"}');
  await redis.zadd(BODY_KEY, DUE_MS + 3600000, '{"order":40,"action":"expire"}');
  await redis.zrem(BODY_KEY, '{"order":40,"action":"expire"}');

  // Id mode: the member is a task id, the body beside it.
  await schedule("order-42", '{"order":42,"action":"expire"}', DUE_MS);
  await schedule("order-43", '{"order":43,"action":"expire"}', DUE_MS + 3600000);
  await schedule("order-44", '{"order":44,"action":"expire"}', DUE_MS + 3600000);
  assert(await reschedule("order-43", DUE_MS + 1));
  assert(await cancel("order-44"));
  assert(!(await reschedule("order-44", DUE_MS)));
  await redis.quit();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
