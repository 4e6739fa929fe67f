//! delayd's drain of a loaded backlog, and the common recipe it replaces.

use super::*;

/// Loads a due backlog into staging keys, one per shard key (member `i` into
/// shard `i mod M`, as producers spread them), swaps each in with RENAME so
/// the clock starts with every member due at once, then adds one last member
/// to each shard with a ZADD, as a producer would (RENAME raises no
/// sorted-set event, and each shard's scanner waits for its own), and times
/// until every member is confirmed and forgotten. In id mode the members are
/// ids and their bodies go into `{K}:body` in the same step. Also returns
/// the Redis memory per pending task of the loaded backlog, in bytes, and
/// the CPU ticks the local Redis processes spent over the drain (masters,
/// replicas), when there are any.
pub(super) async fn delayd_drain(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    n: usize,
    size: usize,
    round: usize,
    id_mode: bool,
    watch: &CpuWatch,
) -> Result<(f64, f64, Option<(u64, u64)>, u64), BenchError> {
    let procs = &watch.redis[..];
    let shards = fams.len().max(1);
    let (secs, _): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    // Members 0..staged are staged; each shard gets one more at the end.
    let n = n.max(2 * shards);
    let backlog = Backlog {
        round,
        size,
        id_mode,
        due: (secs - 1) * 1000,
        staged: n - shards,
    };
    backlog.stage(redis, fams).await?;
    let mut bytes = 0u64;
    for fam in fams {
        for k in [
            crate::keys::helper_key(&fam.pending, "staging"),
            crate::keys::helper_key(&fam.pending, "body-staging"),
        ] {
            bytes += memory_usage(redis, &k, 0).await?;
        }
    }
    let per_task = bytes as f64 / backlog.staged as f64;
    let ticks_before = cpu_ticks(procs);
    let daemon_before = proc_ticks(watch.daemon);
    let start = Instant::now();
    backlog.swap_in(redis, fams).await?;
    wait_drained(redis, fams, n, start).await?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let ticks = (!procs.is_empty()).then(|| {
        let after = cpu_ticks(procs);
        (
            after.0.saturating_sub(ticks_before.0),
            after.1.saturating_sub(ticks_before.1),
        )
    });
    let daemon_ticks = proc_ticks(watch.daemon).saturating_sub(daemon_before);
    Ok((rate, per_task, ticks, daemon_ticks))
}

/// The backlog of one round: `staged` members due at `due`, then one more
/// per shard.
struct Backlog {
    round: usize,
    size: usize,
    id_mode: bool,
    due: i64,
    staged: usize,
}

impl Backlog {
    fn id(&self, i: usize) -> Vec<u8> {
        format!("r{}-{i:09}", self.round).into_bytes()
    }

    fn body(&self, i: usize) -> Vec<u8> {
        body_of(&format!("r{}", self.round), i, self.size)
    }

    /// Writes members 0..staged into each shard's staging keys (member `i`
    /// into shard `i mod M`), 5000 at a time.
    async fn stage(&self, redis: &mut RedisConn, fams: &[KeyFamily]) -> Result<(), BenchError> {
        let shards = fams.len().max(1);
        for start in (0..self.staged).step_by(5000) {
            let end = (start + 5000).min(self.staged);
            for (s, fam) in fams.iter().enumerate() {
                let mut cmd = redis::cmd("ZADD");
                cmd.arg(crate::keys::helper_key(&fam.pending, "staging"));
                let mut bodies = redis::cmd("HSET");
                bodies.arg(crate::keys::helper_key(&fam.pending, "body-staging"));
                let mut any = false;
                for i in (start..end).filter(|i| i % shards == s) {
                    let body = self.body(i);
                    if self.id_mode {
                        cmd.arg(self.due).arg(self.id(i));
                        bodies.arg(self.id(i)).arg(body);
                    } else {
                        cmd.arg(self.due).arg(body);
                    }
                    any = true;
                }
                if !any {
                    continue;
                }
                let _: i64 = cmd
                    .query_async(redis)
                    .await
                    .map_err(|e| fail("redis")(e.to_string()))?;
                if self.id_mode {
                    let _: i64 = bodies
                        .query_async(redis)
                        .await
                        .map_err(|e| fail("redis")(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// Renames each shard's staging keys into place and adds its last
    /// member with a ZADD, in one transaction per shard.
    async fn swap_in(&self, redis: &mut RedisConn, fams: &[KeyFamily]) -> Result<(), BenchError> {
        for (s, fam) in fams.iter().enumerate() {
            let i = self.staged + s;
            let last = self.body(i);
            let mut pipe = redis::pipe();
            // One transaction per shard: no claim sees an id before its body.
            pipe.atomic();
            if self.id_mode {
                pipe.cmd("RENAME")
                    .arg(crate::keys::helper_key(&fam.pending, "body-staging"))
                    .arg(&fam.body)
                    .ignore()
                    .cmd("HSET")
                    .arg(&fam.body)
                    .arg(self.id(i))
                    .arg(&last)
                    .ignore();
            }
            pipe.cmd("RENAME")
                .arg(crate::keys::helper_key(&fam.pending, "staging"))
                .arg(&fam.pending)
                .ignore();
            pipe.cmd("ZADD")
                .arg(&fam.pending)
                .arg(self.due)
                .arg(if self.id_mode { self.id(i) } else { last })
                .ignore();
            let _: () = pipe
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
        }
        Ok(())
    }
}

/// Waits until no shard holds a pending or in-flight member, at most 600 s
/// after `start`.
async fn wait_drained(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    n: usize,
    start: Instant,
) -> Result<(), BenchError> {
    let limit = Duration::from_secs(600);
    let progress = crate::progress::Progress::new("bench: delayd drained", Some(n as u64));
    loop {
        let (mut p, mut i) = (0u64, 0u64);
        // One pipeline per shard: a cluster serves each from its own master.
        for fam in fams {
            let (fp, fi): (u64, u64) = redis::pipe()
                .cmd("ZCARD")
                .arg(&fam.pending)
                .cmd("ZCARD")
                .arg(&fam.inflight)
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
            p += fp;
            i += fi;
        }
        progress.set((n as u64).saturating_sub(p + i));
        if p == 0 && i == 0 {
            progress.clear();
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(BenchError::Runtime(format!(
                "bench: delayd did not drain {n} members within {limit:?} ({p} pending, {i} in flight)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The recipe delayd replaces, for comparison: one Lua call pops one due
/// member, which is then published without confirms (so a crash or an
/// unroutable publish loses it). Times a drain of `n` due members, in a
/// helper key in `key`'s slot.
pub(super) async fn common_recipe_drain(
    redis: &mut RedisConn,
    amqp: &Connection,
    names: &Names,
    key: &str,
    n: usize,
    size: usize,
) -> Result<f64, BenchError> {
    let key = crate::keys::helper_key(key, "recipe");
    let (secs, _): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    for start in (0..n).step_by(5000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&key);
        for i in start..(start + 5000).min(n) {
            cmd.arg((secs - 1) * 1000).arg(body_of("recipe", i, size));
        }
        let _: i64 = cmd
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
    }
    let pop = redis::Script::new(
        "local m = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
         if #m == 0 then return false end
         redis.call('ZREM', KEYS[1], m[1])
         return m[1]",
    );
    let ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    let start = Instant::now();
    let mut done = 0usize;
    while done < n {
        let now_ms = wall_ms_f() as i64;
        let member: Option<Vec<u8>> = pop
            .key(&key)
            .arg(now_ms)
            .invoke_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        let Some(member) = member else { break };
        ch.basic_publish(
            names.exchange.as_str().into(),
            names.routing_key.as_str().into(),
            BasicPublishOptions::default(),
            &member,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .map_err(|e| fail("recipe publish")(e.to_string()))?;
        done += 1;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    let _ = ch.close(200, "done".into()).await;
    let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query_async(redis).await;
    Ok(rate)
}
