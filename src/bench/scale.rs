//! `delayd bench --scale N`: what a backlog of N pending members costs, in
//! body and in id mode, so a user can size Redis for theirs: Redis memory
//! per task, Redis time and script calls per member claimed with N behind
//! it, delayd's resident memory, and its Redis commands per second while
//! nothing is due.
//!
//! Each (mode, N) gets its own key family and its own delayd, started only
//! after the backlog is written, so the drain measures claims against a
//! full sorted set and nothing else.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::far_writes::{commandstats, script_calls};
use super::{
    add_member, body_of, declare_bench_queue, fail, idle_commands, memory_usage, queue_writes,
    rss_kb, send_pipe, start_consumer, start_daemon, stop_child, writes_to, BenchArgs, BenchError,
    BenchState, Counter, Ctx, Names,
};
use crate::config;
use crate::redis_conn::{Redis, RedisConn};
use crate::store::KeyFamily;

/// Members per `ZADD`/`HSET` while the backlog is written.
const CHUNK: usize = 1000;
/// Commands per pipeline while the backlog is written.
const DEPTH: usize = 16;
/// How far ahead the backlog is due: never within the run.
const AHEAD_MS: i64 = 30 * 86_400_000;

/// What one (mode, N) cost.
#[derive(Default)]
struct Scale {
    id_mode: bool,
    pending: usize,
    /// Redis memory per pending task: the sorted set, and in id mode the
    /// body hash, from `MEMORY USAGE`.
    bytes_per_task: f64,
    /// Seconds to write the backlog (pipelined, from this process).
    fill_secs: f64,
    /// Members delivered per second while draining the due ones.
    drain_rate: f64,
    /// Redis time of script calls per member delivered, in µs.
    script_us: f64,
    /// Script calls per 1,000 members delivered.
    scripts_per_1000: f64,
    /// delayd's peak and final resident memory, KiB.
    rss_kb: (u64, u64),
    /// Commands naming the business's keys per second while nothing is due.
    idle_per_sec: f64,
}

/// Runs every size in `args.scale`, body mode then id mode, and prints one
/// table.
pub(super) async fn bench(
    ctx: &Ctx<'_>,
    redis: &mut RedisConn,
    state: &mut BenchState,
) -> Result<(), BenchError> {
    let _ch = declare_bench_queue(ctx.amqp, ctx.names).await?;
    let counter = Counter::default();
    start_consumer(ctx.amqp, ctx.names, &counter).await?;
    let run = Run {
        args: ctx.args,
        cfg: ctx.cfg,
        names: ctx.names,
        client: ctx.client,
        counter,
    };
    let mut results = Vec::new();
    for id_mode in [false, true] {
        for &pending in &ctx.args.scale {
            let r = run.one(redis, state, id_mode, pending).await;
            // A 50 M family takes a while to free: UNLINK does it in the
            // background instead of blocking Redis.
            unlink(redis, state).await;
            results.push(r?);
        }
    }
    print(ctx.args, &results);
    Ok(())
}

/// What every (mode, N) of one run shares.
struct Run<'a> {
    args: &'a BenchArgs,
    cfg: &'a config::Config,
    names: &'a Names,
    client: &'a Redis,
    counter: Counter,
}

impl Run<'_> {
    /// One (mode, N): write the backlog, measure its memory, drain
    /// `args.messages` due members in front of it, then idle.
    async fn one(
        &self,
        redis: &mut RedisConn,
        state: &mut BenchState,
        id_mode: bool,
        pending: usize,
    ) -> Result<Scale, BenchError> {
        let mode = if id_mode { "id" } else { "body" };
        let key = format!("{}:{mode}:{pending}", self.names.key);
        let fam = KeyFamily::new(&key);
        state.keys = vec![key.clone()];
        eprintln!("bench: writing {pending} members due in 30 days ({mode} mode) ...");
        let now = redis_now_ms(redis).await?;
        let started = Instant::now();
        let size = self.args.size;
        write(redis, &fam, id_mode, 0..pending, now + AHEAD_MS, size).await?;
        let fill_secs = started.elapsed().as_secs_f64();
        let bytes = memory(redis, &fam, id_mode).await?;
        let due = self.args.messages;
        write(
            redis,
            &fam,
            id_mode,
            pending..pending + due,
            now - 1000,
            size,
        )
        .await?;
        let mut scale = self.drain_then_idle(redis, state, &key, mode).await?;
        scale.id_mode = id_mode;
        scale.pending = pending;
        scale.bytes_per_task = bytes as f64 / pending.max(1) as f64;
        scale.fill_secs = fill_secs;
        Ok(scale)
    }

    /// Starts delayd on `key`, waits for the due members to be delivered,
    /// then counts its commands while nothing is due.
    async fn drain_then_idle(
        &self,
        redis: &mut RedisConn,
        state: &mut BenchState,
        key: &str,
        mode: &str,
    ) -> Result<Scale, BenchError> {
        let (args, names) = (self.args, self.names);
        let toml = format!(
            "{}{}[http]\nlisten = \"off\"\n[log]\nlevel = \"warn\"\n[businesses.bench]\nkey = \"{key}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\nmember = \"{mode}\"\n{}\n",
            self.cfg.redis.to_toml(),
            self.cfg.amqp.to_toml(),
            names.exchange,
            names.routing_key,
            args.business.join("\n"),
        );
        let due = args.messages;
        let before = commandstats(redis).await?;
        let base = self.counter.received.load(Ordering::Relaxed);
        let (pid, _) = start_daemon(names, state, &toml)?;
        let drain_rate = delivered(&self.counter, base, due).await?;
        let after = commandstats(redis).await?;
        let (calls, usec) = script_calls(&before, &after);
        let rss = rss_kb(pid);
        eprintln!(
            "bench: counting delayd's Redis commands for {}s with nothing due ...",
            args.idle_secs
        );
        let idle = idle_commands(self.client, redis, &state.keys, args.idle_secs).await?;
        if let Some(mut child) = state.daemon.take() {
            stop_child(&mut child);
        }
        Ok(Scale {
            drain_rate,
            script_us: usec as f64 / due.max(1) as f64,
            scripts_per_1000: calls as f64 * 1000.0 / due.max(1) as f64,
            rss_kb: rss,
            idle_per_sec: idle as f64 / args.idle_secs.max(1) as f64,
            ..Scale::default()
        })
    }
}

/// Redis's clock, in ms, as delayd reads it.
async fn redis_now_ms(redis: &mut RedisConn) -> Result<i64, BenchError> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    Ok(secs * 1000 + micros / 1000)
}

/// Writes members `range` due at `due`, as producers would: `ZADD` in body
/// mode, `HSET` of the body then `ZADD` of the id in id mode.
async fn write(
    redis: &mut RedisConn,
    fam: &KeyFamily,
    id_mode: bool,
    range: std::ops::Range<usize>,
    due: i64,
    size: usize,
) -> Result<(), BenchError> {
    let chunks: Vec<usize> = range.clone().step_by(CHUNK).collect();
    for group in chunks.chunks(DEPTH) {
        let mut pipe = redis::pipe();
        for &start in group {
            let end = (start + CHUNK).min(range.end);
            let (mut zadd, mut hset) = writes_to(fam);
            for i in start..end {
                let body = body_of("scale", i, size);
                let id = || format!("t{i:010}");
                add_member((&mut zadd, &mut hset), id_mode, due, id, body);
            }
            queue_writes(&mut pipe, id_mode, (zadd, hset));
        }
        send_pipe(redis, &pipe).await?;
    }
    Ok(())
}

/// Bytes Redis holds for the pending tasks: the sorted set and, in id mode,
/// the body hash (sampled: exact counting would block Redis on 50 M).
async fn memory(redis: &mut RedisConn, fam: &KeyFamily, id_mode: bool) -> Result<u64, BenchError> {
    let mut keys = vec![&fam.pending];
    if id_mode {
        keys.push(&fam.body);
    }
    let mut total = 0;
    for key in keys {
        total += memory_usage(redis, key, 10_000).await?;
    }
    Ok(total)
}

/// Waits for `n` deliveries after `base`; returns their rate, from the first
/// delivery to the last, so delayd's start is not counted.
async fn delivered(counter: &Counter, base: u64, n: usize) -> Result<f64, BenchError> {
    let limit = Instant::now() + Duration::from_secs(600);
    let mut first = None;
    loop {
        let got = counter
            .received
            .load(Ordering::Relaxed)
            .saturating_sub(base);
        if got > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        if got >= n as u64 {
            let secs = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
            return Ok(n as f64 / secs.max(0.001));
        }
        if Instant::now() > limit {
            return Err(BenchError::Runtime(format!(
                "bench: delayd delivered {got} of {n} due members within 600s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Removes the key families of `state.keys` without blocking Redis.
async fn unlink(redis: &mut RedisConn, state: &mut BenchState) {
    for key in std::mem::take(&mut state.keys) {
        let fam = KeyFamily::new(&key);
        let _: redis::RedisResult<i64> = redis::cmd("UNLINK")
            .arg(&fam.all()[..])
            .query_async(redis)
            .await;
    }
}

fn print(args: &BenchArgs, results: &[Scale]) {
    super::report::heading(&format!(
        "delayd bench --scale: {} due members drained in front of each backlog, {}-byte bodies",
        args.messages, args.size,
    ));
    println!("| mode | pending | Redis bytes/task | write time | drain /s | Redis µs/member (scripts) | scripts/1000 | delayd RSS peak / now | idle cmds/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        println!(
            "| {} | {} | {:.0} | {:.1} s | {:.0} | {:.1} | {:.1} | {:.1} / {:.1} MB | {:.2} |",
            if r.id_mode { "id" } else { "body" },
            r.pending,
            r.bytes_per_task,
            r.fill_secs,
            r.drain_rate,
            r.script_us,
            r.scripts_per_1000,
            r.rss_kb.0 as f64 / 1024.0,
            r.rss_kb.1 as f64 / 1024.0,
            r.idle_per_sec,
        );
    }
}
