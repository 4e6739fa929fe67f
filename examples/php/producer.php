<?php
// A delayd producer in PHP with phpredis: body mode and id mode.
//
// Run by tests/examples.rs against the daemon the suite builds; see
// examples/README.md for what it writes and docs/wire-format.md for why.
//
// Environment: REDIS_URL, BODY_KEY (a body-mode business's key), ID_KEY (an
// id-mode business's key), DUE_MS (epoch ms the tasks are due at).

$url = parse_url(getenv('REDIS_URL') ?: 'redis://127.0.0.1:6379/0');
$redis = new Redis();
$redis->connect($url['host'], $url['port'] ?? 6379);
$redis->select((int) ltrim($url['path'] ?? '/0', '/'));
$BODY_KEY = getenv('BODY_KEY') ?: 'delay:order:expire';
$ID_KEY = getenv('ID_KEY') ?: 'delay:order:timeout';
$DUE_MS = (int) getenv('DUE_MS');

// {K}:suffix, or K:suffix when K already has a {hash tag}.
function helper_key(string $key, string $suffix): string
{
    $open = strpos($key, '{');
    $close = $open === false ? false : strpos($key, '}', $open + 1);
    $tagged = $close !== false && $close > $open + 1;
    return $tagged ? "$key:$suffix" : '{' . $key . '}:' . $suffix;
}

$BODIES = helper_key($ID_KEY, 'body');

// Removes a pending task and its body; leaves an in-flight one alone.
const CANCEL = <<<'LUA'
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
end
return 0
LUA;

// Schedules a task, or replaces its body and due time: one MULTI.
function schedule(Redis $r, string $key, string $bodies, string $id, string $body, int $due): void
{
    $r->multi()->hSet($bodies, $id, $body)->zAdd($key, $due, $id)->exec();
}

// Moves a pending task; false when it is not pending any more.
function reschedule(Redis $r, string $key, string $id, int $due): bool
{
    [, $score] = $r->multi()->zAdd($key, ['XX'], $due, $id)->zScore($key, $id)->exec();
    return $score !== false;
}

// Cancels a pending task and drops its body; false when not pending.
function cancel(Redis $r, string $key, string $bodies, string $id): bool
{
    return $r->eval(CANCEL, [$key, $bodies, $id], 2) === 1;
}

// Body mode: the member is the message.
$redis->zAdd($BODY_KEY, $DUE_MS, '{"order":41,"action":"expire"}');
$redis->zAdd($BODY_KEY, $DUE_MS + 3600000, '{"order":40,"action":"expire"}');
$redis->zRem($BODY_KEY, '{"order":40,"action":"expire"}');

// Id mode: the member is a task id, the body beside it.
schedule($redis, $ID_KEY, $BODIES, 'order-42', '{"order":42,"action":"expire"}', $DUE_MS);
schedule($redis, $ID_KEY, $BODIES, 'order-43', '{"order":43,"action":"expire"}', $DUE_MS + 3600000);
schedule($redis, $ID_KEY, $BODIES, 'order-44', '{"order":44,"action":"expire"}', $DUE_MS + 3600000);
reschedule($redis, $ID_KEY, 'order-43', $DUE_MS + 1) or throw new RuntimeException('order-43 not pending');
cancel($redis, $ID_KEY, $BODIES, 'order-44') or throw new RuntimeException('order-44 not cancelled');
reschedule($redis, $ID_KEY, 'order-44', $DUE_MS) and throw new RuntimeException('order-44 still pending');
$redis->close();
