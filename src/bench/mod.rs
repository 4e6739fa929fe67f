//! `delayd bench`: the raw confirmed-publish ceiling, delayd's drain rate,
//! its lateness and its idle cost, measured in one run on one machine.
//!
//! The ceiling and the drain alternate over several rounds so that a noisy,
//! shared machine affects both alike; the table reports medians and the
//! median of the per-round ratios. delayd runs as a child process, exactly
//! as users run it, against a temporary exchange, queue and key that are
//! removed at the end, also when the bench is interrupted.
//!
//! `--intake` measures the intake instead (see [`intake`]).

mod ceiling;
mod consumer;
mod daemon;
mod drain;
mod far_writes;
mod idle;
mod intake;
mod lateness;
mod procs;
mod report;
mod rounds;
mod scale;
mod shards;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};

use crate::config::{self, Properties};
use crate::redis_conn::{Redis, RedisConn};
use crate::store::{Claimed, KeyFamily};
use ceiling::*;
use consumer::*;
use daemon::*;
use drain::*;
use idle::*;
use lateness::*;
use procs::*;
use report::{join_rates, join_ratios, join_us, median, percentile, row};
use rounds::{Round, Rounds};

/// Producer writes per second in the far-future-writes phase.
const FAR_RATE: u32 = 2000;
/// Seconds the far-future-writes phase runs.
const FAR_SECS: u64 = 5;

/// Arguments of `delayd bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The TOML configuration file (only its [redis] and [amqp] are used).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Members in the backlog to drain, per round.
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Members per second for the lateness phase.
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,
    /// Seconds the lateness phase runs.
    #[arg(long, default_value_t = 10)]
    pub lateness_secs: u64,
    /// Rounds of ceiling-then-drain; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds to count Redis commands while nothing is due.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// Time the ceiling and the drain with no consumer on the queue, so the
    /// broker stores every message (the lateness phase still consumes).
    #[arg(long)]
    pub no_consumer: bool,
    /// Extra lines for the bench business, e.g. "scanners = 4".
    #[arg(long, value_name = "TOML")]
    pub business: Vec<String>,
    /// Measure the intake (messages published with `x-delay`) instead of
    /// the drain: its rate against the broker's plain publish → consume
    /// rate, its memory per message and its end-to-end lateness.
    #[arg(long)]
    pub intake: bool,
    /// Measure what a backlog of this many pending members costs instead of
    /// the drain (Redis memory per task, claim cost, RSS, idle cost), in
    /// body and id mode; repeat for several sizes.
    #[arg(long, value_name = "PENDING", conflicts_with = "intake")]
    pub scale: Vec<usize>,
    /// Also drain the same backlog, every round, from one key and from a
    /// business of this many shards on the same servers, and compare them.
    #[arg(long, value_name = "SHARDS", conflicts_with_all = ["intake", "scale"], value_parser = clap::value_parser!(u16).range(2..=64))]
    pub compare_shards: Option<u16>,
}

/// Why the bench could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The configuration or the `--business` lines are unusable.
    #[error("{0}")]
    Usage(String),
    /// A server failed or went away during the run.
    #[error("{0}")]
    Runtime(String),
}

impl BenchError {
    /// The exit code `delayd bench` ends with: 2 for usage, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            BenchError::Runtime(_) => 1,
        }
    }
}

impl From<config::ConfigError> for BenchError {
    fn from(e: config::ConfigError) -> Self {
        BenchError::Usage(e.to_string())
    }
}

fn fail(context: &str) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Runtime(format!("bench: {context}: {e}"))
}

/// `MEMORY USAGE key SAMPLES samples`: the bytes Redis holds for `key`
/// (0 when it does not exist). `samples = 0` counts every element.
async fn memory_usage(
    redis: &mut crate::redis_conn::RedisConn,
    key: &str,
    samples: u64,
) -> Result<u64, BenchError> {
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(samples)
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    Ok(bytes.unwrap_or(0))
}

/// Runs the benchmark and prints one table.
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let cfg = config::load(&args.config)?;
    let tag = format!("{:08x}", rand::random::<u32>());
    let names = Names {
        exchange: format!("delayd-bench-{tag}"),
        queue: format!("delayd-bench-{tag}"),
        routing_key: "bench".into(),
        // No hash tag: a cluster refuses one on a sharded business. Each
        // key's helpers (staging, recipe) are named by `helper`, in its slot.
        key: format!("delayd:bench:{tag}"),
    };
    let client = Redis::new(&cfg.redis).map_err(|e| BenchError::Usage(e.to_string()))?;
    let mut redis = client
        .connect()
        .await
        .map_err(|e| BenchError::Runtime(format!("bench: cannot use Redis: {e}")))?;
    let amqp = tokio::time::timeout(
        Duration::from_secs(10),
        crate::amqp::connect(&cfg.amqp, "delayd bench"),
    )
    .await
    .map_err(|_| {
        BenchError::Runtime(format!(
            "bench: cannot reach RabbitMQ at {} within 10s",
            cfg.amqp
        ))
    })?
    .map_err(|e| {
        BenchError::Runtime(format!("bench: cannot reach RabbitMQ at {}: {e}", cfg.amqp))
    })?;

    // `timeout`, a closed terminal and Ctrl-C all end the run the same way:
    // through the clean-up below, so no queue, key or temporary config with
    // the URLs in it is left behind.
    let mut signals = signal_hook_tokio::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| fail("signal handlers")(e.to_string()))?;
    let mut state = BenchState::default();
    let run = async {
        if args.intake {
            intake::bench(&args, &cfg, &names, &mut redis, &amqp, &mut state).await
        } else if !args.scale.is_empty() {
            scale::bench(&args, &cfg, &names, &client, &mut redis, &amqp, &mut state).await
        } else {
            bench(&args, &cfg, &names, &client, &mut redis, &amqp, &mut state).await
        }
    };
    let outcome = tokio::select! {
        r = run => r,
        _ = signals.next() => Err(BenchError::Runtime("bench interrupted; cleaned up".into())),
    };
    signals.handle().close();
    // Clean up whatever happened above.
    if let Some(mut child) = state.daemon.take() {
        stop_child(&mut child);
    }
    let ch = amqp.create_channel().await.ok();
    if let Some(ch) = ch {
        let _ = ch
            .queue_delete(names.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = ch
            .exchange_delete(
                names.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        for (x, q) in &state.intake_names {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = ch
                .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
    // One DEL per key family: on a cluster, each shard's keys share a slot
    // but the shards do not.
    let keys = if state.keys.is_empty() {
        vec![names.key.clone()]
    } else {
        std::mem::take(&mut state.keys)
    };
    for key in &keys {
        let fam = KeyFamily::new(key);
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(&fam.all()[..])
            .arg(crate::keys::helper_key(key, "staging"))
            .arg(crate::keys::helper_key(key, "body-staging"))
            .arg(crate::keys::helper_key(key, "recipe"))
            .query_async(&mut redis)
            .await;
    }
    if let Some(path) = state.config_path.take() {
        let _ = std::fs::remove_file(path);
    }
    let _ = amqp.close(200, "bench done".into()).await;
    outcome
}

struct Names {
    exchange: String,
    queue: String,
    routing_key: String,
    key: String,
}

#[derive(Default)]
struct BenchState {
    daemon: Option<Child>,
    config_path: Option<PathBuf>,
    /// The bench business's keys (its shards'), once its config is loaded.
    keys: Vec<String>,
    /// The intake bench's exchanges and queues (exchange, queue).
    intake_names: Vec<(String, String)>,
}

async fn bench(
    args: &BenchArgs,
    cfg: &config::Config,
    names: &Names,
    client: &Redis,
    redis: &mut RedisConn,
    amqp: &Connection,
    state: &mut BenchState,
) -> Result<(), BenchError> {
    let ch = declare_bench_queue(amqp, names).await?;

    // One consumer for every phase, so the broker does the same work in
    // each; with --no-consumer, only from the common recipe on, and the
    // queue is purged between phases instead.
    let counter = Counter::default();
    if !args.no_consumer {
        start_consumer(amqp, names, &counter).await?;
    }

    // delayd as users run it, on a temporary business.
    let extra = args.business.join("\n");
    let mut toml = format!(
        "{}{}[http]\nlisten = \"off\"\n[log]\nlevel = \"warn\"\n[businesses.bench]\nkey = \"{}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\n{extra}\n",
        cfg.redis.to_toml(),
        cfg.amqp.to_toml(),
        names.key,
        names.exchange,
        names.routing_key
    );
    if let Some(shards) = args.compare_shards {
        toml.push_str(&format!(
            "[businesses.bench_sharded]\nkey = \"{}:sharded\"\nexchange = \"{}\"\nrouting_key = \"{}\"\nshards = {shards}\n{extra}\n",
            names.key, names.exchange, names.routing_key
        ));
    }
    let (pid, business) = start_daemon(names, state, &toml)?;
    // The same properties delayd will send, so the broker's cost of the
    // message format can be told apart from delayd's own.
    let format = Some(business);
    // With `shards = M` delayd reads M keys: the backlog is spread over them
    // as producers would spread it.
    let keys = format
        .as_ref()
        .map(|b| b.keys())
        .unwrap_or_else(|| vec![names.key.clone()]);
    state.keys = keys.clone();

    let body_len = args.size;
    let fams: Vec<KeyFamily> = keys.iter().map(|k| KeyFamily::new(k)).collect();
    let watch = CpuWatch {
        redis: redis_processes(client, redis).await,
        daemon: pid,
    };
    let redis_procs = &watch.redis;
    let mut compare = match args.compare_shards {
        Some(shards) => Some(shard_compare(args, state, &fams, shards as usize, &format)?),
        None => None,
    };
    eprintln!("bench: finding the raw publisher's best channels and window ...");
    let trial_n = (args.messages / 4).max(1000);
    let mut best = (0.0f64, 1usize, 256usize);
    for (channels, window) in [(1, 256), (1, 1024), (2, 1024), (4, 1024), (2, 4096)] {
        let rate = raw_publish(amqp, names, trial_n, body_len, channels, window, None).await?;
        between_phases(&ch, names, &counter, args.no_consumer).await?;
        eprintln!("bench:   {channels} channel(s) x window {window}: {rate:.0} msg/s");
        if rate > best.0 {
            best = (rate, channels, window);
        }
    }
    let (_, best_channels, best_window) = best;

    let id_mode = format.as_ref().is_some_and(|b| b.member.is_id());
    let mut rounds = Rounds::default();
    for round in 1..=args.rounds.max(1) {
        let raw = raw_publish(
            amqp,
            names,
            args.messages,
            body_len,
            best_channels,
            best_window,
            None,
        )
        .await?;
        between_phases(&ch, names, &counter, args.no_consumer).await?;
        let same = raw_publish(
            amqp,
            names,
            args.messages,
            body_len,
            best_channels,
            best_window,
            format.as_ref(),
        )
        .await?;
        between_phases(&ch, names, &counter, args.no_consumer).await?;
        let (drain, bytes_per_task, ticks, daemon_ticks) = delayd_drain(
            redis,
            &fams,
            args.messages,
            body_len,
            round,
            id_mode,
            &watch,
        )
        .await?;
        // /proc counts CPU time in USER_HZ ticks, 100 per second on Linux.
        let per = |t: u64| t as f64 * 10_000.0 / args.messages.max(2) as f64;
        let r = Round {
            raw,
            same,
            drain,
            bytes_per_task,
            cpu_daemon: per(daemon_ticks),
            cpu_redis: ticks.map(|(m, r)| (per(m), per(r))),
        };
        between_phases(&ch, names, &counter, args.no_consumer).await?;
        if let Some(c) = compare.as_mut() {
            c.round(redis, round, &watch).await?;
            between_phases(&ch, names, &counter, args.no_consumer).await?;
        }
        eprintln!(
            "bench: round {round}: raw ceiling {raw:.0} msg/s, raw with delayd's format {same:.0} msg/s, delayd drain {drain:.0} msg/s, ratio {:.3} ({:.3} to the same format)",
            r.ratio(),
            r.same_ratio()
        );
        rounds.push(r);
    }
    let rss_after_drain = rss_kb(pid);
    if args.no_consumer {
        start_consumer(amqp, names, &counter).await?;
    }

    eprintln!("bench: the common recipe (one member per Lua call, no confirms) ...");
    let recipe = common_recipe_drain(redis, amqp, names, &keys[0], args.messages, body_len).await?;
    wait_consumed(&counter, Duration::from_secs(60)).await;

    eprintln!(
        "bench: lateness at {} members/s for {} s ...",
        args.rate, args.lateness_secs
    );
    let offset = clock_offset_ms(redis).await?;
    counter.record.store(true, Ordering::Relaxed);
    let scheduled = lateness_phase(
        redis,
        &fams,
        id_mode,
        args.rate,
        args.lateness_secs,
        body_len,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while counter.lateness_ms.lock().map(|v| v.len()).unwrap_or(0) < scheduled
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    counter.record.store(false, Ordering::Relaxed);
    let mut lat: Vec<f64> = counter
        .lateness_ms
        .lock()
        .map(|v| v.iter().map(|l| l - offset).collect())
        .unwrap_or_default();
    lat.sort_by(|a, b| a.total_cmp(b));

    eprintln!("bench: idle Redis commands over {} s ...", args.idle_secs);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = idle_commands(client, redis, &keys, args.idle_secs.max(1)).await?;
    let idle_per_s = idle as f64 / args.idle_secs.max(1) as f64;
    eprintln!("bench: producers writing {FAR_RATE} members/s due in a week for {FAR_SECS} s ...");
    let far = far_writes::run(redis, &fams, FAR_RATE, FAR_SECS).await?;
    let rss_end = rss_kb(pid);

    let med_raw = rounds.median(|r| r.raw);
    let med_same = rounds.median(|r| r.same);
    report::heading(&format!(
        "delayd bench: {} x {}-byte persistent messages into a durable queue ({}), {} rounds, one run",
        args.messages,
        args.size,
        if args.no_consumer {
            "no consumer while timed"
        } else {
            "one consumer"
        },
        rounds.len()
    ));
    row(
        "raw confirmed publish (ceiling)",
        &format!("{med_raw:.0} msg/s"),
        &format!("median; best of sweep: {best_channels} channel(s), window {best_window}"),
    );
    row(
        "raw publish, delayd's format",
        &format!("{med_same:.0} msg/s"),
        &format!(
            "median; {}; the broker's cost of the format: {:.0}%",
            match format.as_ref().map(|b| b.properties) {
                Some(Properties::Standard) | None => {
                    "message_id, type, app_id, timestamp (the default, no headers)"
                }
                Some(Properties::Full) => "message_id, timestamp, x-delayd-* headers",
                Some(Properties::NoHeaders) => "message_id, timestamp, no headers",
                Some(Properties::Bare) => "no properties: the ceiling's own message",
            },
            (1.0 - med_same / med_raw) * 100.0
        ),
    );
    row(
        "delayd drain (claim+publish+ack)",
        &format!("{:.0} msg/s", rounds.median(|r| r.drain)),
        &format!("median; rounds {}", join_rates(&rounds.each(|r| r.drain))),
    );
    row(
        "delayd / ceiling",
        &format!("{:.3}", rounds.median(Round::ratio)),
        &format!(
            "median of per-round ratios {}",
            join_ratios(&rounds.each(Round::ratio))
        ),
    );
    row(
        "delayd / same-format publisher",
        &format!("{:.3}", rounds.median(Round::same_ratio)),
        &format!(
            "median of per-round ratios {}; delayd's own overhead",
            join_ratios(&rounds.each(Round::same_ratio))
        ),
    );
    for (label, value, note) in compare.iter().flat_map(|c| c.rows()) {
        row(&label, &value, &note);
    }
    row(
        "Redis memory per pending task",
        &format!("{:.0} B", rounds.median(|r| r.bytes_per_task)),
        &format!(
            "MEMORY USAGE of the loaded backlog{}, {body_len}-byte bodies",
            if id_mode { " (ids and {K}:body)" } else { "" }
        ),
    );
    match rounds.cpu_redis() {
        None => row(
            "Redis CPU per drained member",
            "unknown",
            "its redis-server processes are not on this machine",
        ),
        Some((masters, replicas)) => {
            let replicas = if redis_procs.iter().any(|p| p.replica) {
                format!("; its replicas {:.1} µs more", median(&replicas))
            } else {
                String::new()
            };
            row(
                "Redis CPU per drained member",
                &format!("{:.1} µs", median(&masters)),
                &format!(
                    "median; rounds {}; user+system of {} master(s){replicas}",
                    join_us(&masters),
                    redis_procs.iter().filter(|p| !p.replica).count()
                ),
            );
        }
    }
    row(
        "delayd CPU per drained member",
        &format!("{:.1} µs", rounds.median(|r| r.cpu_daemon)),
        &format!(
            "median; rounds {}; user+system of the delayd process",
            join_us(&rounds.each(|r| r.cpu_daemon))
        ),
    );
    row(
        "common recipe drain",
        &format!("{recipe:.0} msg/s"),
        &format!(
            "one member per Lua call, no confirms; delayd drains {:.1}x faster",
            rounds.median(|r| r.drain) / recipe.max(1.0)
        ),
    );
    if lat.is_empty() {
        row("lateness", "no samples", "");
    } else {
        row(
            &format!("lateness at {}/s (due -> consumer)", args.rate),
            &format!("p99 {:.1} ms", percentile(&lat, 0.99)),
            &format!(
                "p50 {:.1} ms, max {:.1} ms, min {:.1} ms, {} of {} received",
                percentile(&lat, 0.50),
                lat.last().copied().unwrap_or(0.0),
                lat.first().copied().unwrap_or(0.0),
                lat.len(),
                scheduled
            ),
        );
    }
    row(
        "idle Redis commands",
        &format!("{idle_per_s:.2} /s"),
        "one business, nothing due (MONITOR, commands naming its key)",
    );
    row(
        &format!("far-future writes at {FAR_RATE}/s"),
        &format!("{:.3} /write", far.calls_per_write),
        &format!(
            "Redis commands per producer ZADD due in a week ({:.4} scripts), Redis time {:.2}x the producers'; {} writes",
            far.scripts_per_write, far.time_ratio, far.writes
        ),
    );
    row(
        "delayd RSS",
        &format!("{:.1} MB", rss_end.1 as f64 / 1024.0),
        &format!(
            "peak {:.1} MB after the drains, {:.1} MB at the end",
            rss_after_drain.0 as f64 / 1024.0,
            rss_end.0 as f64 / 1024.0
        ),
    );
    Ok(())
}

/// The comparison's second business, as the started delayd loaded it; its
/// keys join the ones cleaned up at the end.
fn shard_compare(
    args: &BenchArgs,
    state: &mut BenchState,
    fams: &[KeyFamily],
    shards: usize,
    format: &Option<config::Business>,
) -> Result<shards::ShardCompare, BenchError> {
    let path = state
        .config_path
        .clone()
        .ok_or_else(|| BenchError::Usage("bench: no bench config".into()))?;
    let loaded =
        config::load(&path).map_err(|e| BenchError::Usage(format!("bench: --business: {e}")))?;
    let sharded: Vec<String> = loaded
        .businesses
        .iter()
        .find(|b| b.name == "bench_sharded")
        .map(|b| b.keys())
        .ok_or_else(|| BenchError::Usage("bench: no sharded business".into()))?;
    state.keys.extend(sharded.iter().cloned());
    let backlog = shards::Backlog {
        n: args.messages,
        size: args.size,
        id_mode: format.as_ref().is_some_and(|b| b.member.is_id()),
    };
    Ok(shards::ShardCompare::new(
        shards,
        backlog,
        fams.to_vec(),
        sharded.iter().map(|k| KeyFamily::new(k)).collect(),
    ))
}

fn body_of(tag: &str, i: usize, size: usize) -> Vec<u8> {
    let mut body = format!("{tag}-{i:09}-").into_bytes();
    body.resize(size.max(body.len()), b'x');
    body
}
