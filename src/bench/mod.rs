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

mod far_writes;
mod intake;
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

/// Writes `toml` to a temporary file readable by us only (it holds the
/// URLs with their passwords) and starts `delayd run` on it, as users run
/// it. Returns the child's pid and the bench business as loaded.
fn start_daemon(
    names: &Names,
    state: &mut BenchState,
    toml: &str,
) -> Result<(u32, config::Business), BenchError> {
    let path = std::env::temp_dir().join(format!("delayd-bench-{}.toml", names.queue));
    std::fs::write(&path, toml).map_err(|e| fail("write temp config")(e.to_string()))?;
    state.config_path = Some(path.clone());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    let bench_cfg =
        config::load(&path).map_err(|e| BenchError::Usage(format!("bench: --business: {e}")))?;
    let business = bench_cfg
        .businesses
        .into_iter()
        .next()
        .ok_or_else(|| BenchError::Usage("bench: no bench business".into()))?;
    state.keys = business.keys();
    let exe = std::env::current_exe().map_err(|e| fail("own path")(e.to_string()))?;
    let child = Command::new(exe)
        .args(["run", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| fail("start delayd")(e.to_string()))?;
    let pid = child.id();
    state.daemon = Some(child);
    Ok((pid, business))
}

fn stop_child(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Counts deliveries and keeps the lateness of the ones that carry a due time.
#[derive(Clone, Default)]
struct Counter {
    received: Arc<AtomicU64>,
    lateness_ms: Arc<Mutex<Vec<f64>>>,
    record: Arc<std::sync::atomic::AtomicBool>,
}

fn wall_ms_f() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
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
    let ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    crate::amqp::declare_bound_queue(
        &ch,
        &names.exchange,
        &names.queue,
        &names.routing_key,
        FieldTable::default(),
    )
    .await
    .map_err(|e| fail("declare exchange and queue")(e.to_string()))?;

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

/// A distinct body of `size` bytes (longer only if the tag needs it).
/// The due time of a lateness-phase body (`late<due>-...`), if it is one.
fn due_in_body(body: &[u8]) -> Option<i64> {
    let rest = body.strip_prefix(b"late")?;
    let end = rest.iter().position(|b| *b == b'-')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

fn body_of(tag: &str, i: usize, size: usize) -> Vec<u8> {
    let mut body = format!("{tag}-{i:09}-").into_bytes();
    body.resize(size.max(body.len()), b'x');
    body
}

/// (peak, current) resident set of a process, in KiB.
fn rss_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Consumes the bench queue without acks, counting deliveries and, while
/// asked to, recording each one's lateness.
async fn start_consumer(
    amqp: &Connection,
    names: &Names,
    counter: &Counter,
) -> Result<(), BenchError> {
    let consumer_ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    consumer_ch
        .basic_qos(2000, BasicQosOptions::default())
        .await
        .map_err(|e| fail("qos")(e.to_string()))?;
    let mut consumer = consumer_ch
        .basic_consume(
            names.queue.as_str().into(),
            "delayd-bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| fail("consume")(e.to_string()))?;
    let c = counter.clone();
    tokio::spawn(async move {
        while let Some(Ok(d)) = consumer.next().await {
            c.received.fetch_add(1, Ordering::Relaxed);
            if c.record.load(Ordering::Relaxed) {
                let header = d
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get("x-delayd-due").cloned());
                let due = match header {
                    Some(AMQPValue::LongLongInt(due)) => Some(due),
                    _ => due_in_body(&d.data),
                };
                if let Some(due) = due {
                    let late = wall_ms_f() - due as f64;
                    if let Ok(mut v) = c.lateness_ms.lock() {
                        v.push(late);
                    }
                }
            }
        }
    });

    Ok(())
}

/// Between two timed phases: let the consumer catch up, or empty the queue
/// when there is none, so every phase starts from the same state.
async fn between_phases(
    ch: &lapin::Channel,
    names: &Names,
    counter: &Counter,
    no_consumer: bool,
) -> Result<(), BenchError> {
    if no_consumer {
        ch.queue_purge(names.queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .map_err(|e| fail("purge queue")(e.to_string()))?;
        // The broker deletes purged persistent messages in the background;
        // let that finish rather than time the next phase against it.
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        wait_consumed(counter, Duration::from_secs(60)).await;
    }
    Ok(())
}

async fn wait_consumed(counter: &Counter, limit: Duration) {
    let start = Instant::now();
    let mut last = counter.received.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = counter.received.load(Ordering::Relaxed);
        if now == last || start.elapsed() > limit {
            return;
        }
        last = now;
    }
}

/// A plain lapin publisher: confirms on, `window` publishes in flight per
/// channel, persistent and mandatory like delayd's. Without `format` it
/// sends no other property (the ceiling); with one, exactly the properties
/// delayd sends for that business. Its bodies are distinct, like the
/// members of a sorted set, and as large as the drain's. Returns messages/s.
async fn raw_publish(
    amqp: &Connection,
    names: &Names,
    n: usize,
    size: usize,
    channels: usize,
    window: usize,
    format: Option<&config::Business>,
) -> Result<f64, BenchError> {
    let mut chans = Vec::new();
    for _ in 0..channels {
        let ch = amqp
            .create_channel()
            .await
            .map_err(|e| fail("channel")(e.to_string()))?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| fail("confirm_select")(e.to_string()))?;
        chans.push(ch);
    }
    let start = Instant::now();
    let per = n.div_ceil(channels);
    let run = rand::random::<u32>();
    let mut tasks = Vec::new();
    for (i, ch) in chans.into_iter().enumerate() {
        let count = per.min(n.saturating_sub(i * per));
        let exchange = names.exchange.clone();
        let rk = names.routing_key.clone();
        let format = format.cloned();
        let key = names.key.clone();
        tasks.push(tokio::spawn(async move {
            let mut inflight = FuturesUnordered::new();
            for j in 0..count {
                let body = body_of(&format!("raw{run:08x}-{i}"), j, size);
                while inflight.len() >= window {
                    if let Some(r) = inflight.next().await {
                        r?;
                    }
                }
                let props = match &format {
                    None => BasicProperties::default().with_delivery_mode(2),
                    Some(b) => {
                        let claimed = Claimed {
                            member: body.clone(),
                            due_ms: wall_ms_f() as i64,
                            attempt: 1,
                            body: None,
                        };
                        crate::amqp::properties(b, &key, &claimed, claimed.due_ms)
                    }
                };
                let confirm = ch
                    .basic_publish(
                        exchange.as_str().into(),
                        rk.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        &body,
                        props,
                    )
                    .await?;
                inflight.push(confirm);
            }
            while let Some(r) = inflight.next().await {
                r?;
            }
            let _ = ch.close(200, "done".into()).await;
            Ok::<(), lapin::Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| fail("raw publisher")(e.to_string()))?
            .map_err(|e| fail("raw publisher")(e.to_string()))?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

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
async fn delayd_drain(
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
    let id_of = |i: usize| format!("r{round}-{i:09}").into_bytes();
    let (secs, _): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    let due = (secs - 1) * 1000;
    // Members 0..staged are staged; each shard gets one more at the end.
    let n = n.max(2 * shards);
    let staged = n - shards;
    for start in (0..staged).step_by(5000) {
        let end = (start + 5000).min(staged);
        for (s, fam) in fams.iter().enumerate() {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(crate::keys::helper_key(&fam.pending, "staging"));
            let mut bodies = redis::cmd("HSET");
            bodies.arg(crate::keys::helper_key(&fam.pending, "body-staging"));
            let mut any = false;
            for i in (start..end).filter(|i| i % shards == s) {
                let body = body_of(&format!("r{round}"), i, size);
                if id_mode {
                    cmd.arg(due).arg(id_of(i));
                    bodies.arg(id_of(i)).arg(body);
                } else {
                    cmd.arg(due).arg(body);
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
            if id_mode {
                let _: i64 = bodies
                    .query_async(redis)
                    .await
                    .map_err(|e| fail("redis")(e.to_string()))?;
            }
        }
    }
    let mut bytes = 0u64;
    for fam in fams {
        for k in [
            crate::keys::helper_key(&fam.pending, "staging"),
            crate::keys::helper_key(&fam.pending, "body-staging"),
        ] {
            let b: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .arg("SAMPLES")
                .arg(0)
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
            bytes += b.unwrap_or(0);
        }
    }
    let per_task = bytes as f64 / staged as f64;
    let ticks_before = cpu_ticks(procs);
    let daemon_before = proc_ticks(watch.daemon);
    let start = Instant::now();
    for (s, fam) in fams.iter().enumerate() {
        let i = staged + s;
        let last = body_of(&format!("r{round}"), i, size);
        let mut pipe = redis::pipe();
        // One transaction per shard: no claim sees an id before its body.
        pipe.atomic();
        if id_mode {
            pipe.cmd("RENAME")
                .arg(crate::keys::helper_key(&fam.pending, "body-staging"))
                .arg(&fam.body)
                .ignore()
                .cmd("HSET")
                .arg(&fam.body)
                .arg(id_of(i))
                .arg(&last)
                .ignore();
        }
        pipe.cmd("RENAME")
            .arg(crate::keys::helper_key(&fam.pending, "staging"))
            .arg(&fam.pending)
            .ignore();
        pipe.cmd("ZADD")
            .arg(&fam.pending)
            .arg(due)
            .arg(if id_mode { id_of(i) } else { last })
            .ignore();
        let _: () = pipe
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
    }
    let limit = Duration::from_secs(600);
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
        if p == 0 && i == 0 {
            break;
        }
        if start.elapsed() > limit {
            return Err(BenchError::Runtime(format!(
                "bench: delayd did not drain {n} members within {limit:?} ({p} pending, {i} in flight)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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

/// The processes whose CPU time a drain is charged with.
struct CpuWatch {
    /// The local redis-server processes (masters and replicas).
    redis: Vec<RedisProcess>,
    /// delayd's own process.
    daemon: u32,
}

/// A redis-server process on this machine that serves the bench.
struct RedisProcess {
    pid: u32,
    replica: bool,
}

/// The local redis-server processes behind the connection: every master (a
/// cluster's all, else the one server) and their replicas, found by the
/// `process_id` each reports. A pid counts only if /proc shows a
/// redis-server listening on the node's port, so servers on other machines
/// are left out (and the CPU row then says unknown).
async fn redis_processes(redis: &Redis, conn: &RedisConn) -> Vec<RedisProcess> {
    let Ok(masters) = conn.masters(redis).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for m in &masters {
        let Ok(client) = conn.subscriber(redis, m) else {
            continue;
        };
        let Some((pid, replicas)) = node_info(&client).await else {
            continue;
        };
        if let Some(pid) = pid {
            out.push(RedisProcess {
                pid,
                replica: false,
            });
        }
        for addr in replicas {
            let Ok(client) = redis.node_client(&addr) else {
                continue;
            };
            if let Some((Some(pid), _)) = node_info(&client).await {
                out.push(RedisProcess { pid, replica: true });
            }
        }
    }
    out
}

/// A node's local pid (when /proc confirms it) and its replicas' addresses.
async fn node_info(client: &redis::Client) -> Option<(Option<u32>, Vec<crate::redis_conn::Addr>)> {
    let mut c = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .ok()?;
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .ok()?;
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let pid = field(&server, "process_id:").and_then(|v| v.parse::<u32>().ok());
    let port = field(&server, "tcp_port:").unwrap_or_default();
    // Redis titles its process "redis-server <addr>:<port> ...".
    let local = pid.filter(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.starts_with("redis-server") && cmdline.contains(&format!(":{port}"))
    });
    // slave0:ip=127.0.0.1,port=31003,state=online,offset=...,lag=0
    let replicas = replication
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("ip="))
        .filter_map(|l| {
            let kv = |k: &str| {
                l.split([':', ','])
                    .find_map(|p| p.strip_prefix(k))
                    .map(str::to_string)
            };
            Some(crate::redis_conn::Addr {
                host: kv("ip=")?,
                port: kv("port=")?.parse().ok()?,
            })
        })
        .collect();
    Some((local, replicas))
}

/// User plus system CPU ticks so far of one process (0 if it is gone).
fn proc_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that ends the command name: state is the 3rd
    // field of the line, utime the 14th and stime the 15th.
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// User plus system CPU ticks so far of the masters and of the replicas.
fn cpu_ticks(procs: &[RedisProcess]) -> (u64, u64) {
    let mut sum = (0u64, 0u64);
    for p in procs {
        let ticks = proc_ticks(p.pid);
        if p.replica {
            sum.1 += ticks;
        } else {
            sum.0 += ticks;
        }
    }
    sum
}

/// The recipe delayd replaces, for comparison: one Lua call pops one due
/// member, which is then published without confirms (so a crash or an
/// unroutable publish loses it). Times a drain of `n` due members, in a
/// helper key in `key`'s slot.
async fn common_recipe_drain(
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

/// Redis's clock minus this machine's, in ms, so lateness compares like with like.
async fn clock_offset_ms(redis: &mut RedisConn) -> Result<f64, BenchError> {
    let mut best: Option<(f64, f64)> = None;
    for _ in 0..5 {
        let t0 = wall_ms_f();
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        let t1 = wall_ms_f();
        let rtt = t1 - t0;
        let off = (s as f64 * 1000.0 + us as f64 / 1000.0) - (t0 + t1) / 2.0;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, off));
        }
    }
    Ok(best.map(|(_, o)| -o).unwrap_or(0.0))
}

/// A producer that, every 10 ms, schedules the members due one second later
/// at `rate` per second, member `i` into shard `i mod M`; in id mode ids
/// with their bodies in the shard's `{K}:body`, in one transaction per
/// shard. Returns how many it scheduled.
async fn lateness_phase(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    id_mode: bool,
    rate: u32,
    secs: u64,
    size: usize,
) -> Result<usize, BenchError> {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    let t0 = s * 1000 + us / 1000 + 1000;
    let total = (rate as u64 * secs) as usize;
    let spacing = 1000.0 / rate as f64;
    let shards = fams.len().max(1);
    let started = Instant::now();
    let mut next = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while next < total {
        tick.tick().await;
        // Everything due within the next second (of the schedule) is added now.
        let horizon = started.elapsed().as_millis() as f64 + 1000.0;
        let mut zadds: Vec<redis::Cmd> = fams
            .iter()
            .map(|f| {
                let mut c = redis::cmd("ZADD");
                c.arg(&f.pending);
                c
            })
            .collect();
        let mut hsets: Vec<redis::Cmd> = fams
            .iter()
            .map(|f| {
                let mut c = redis::cmd("HSET");
                c.arg(&f.body);
                c
            })
            .collect();
        let mut any = vec![false; shards];
        while next < total && (next as f64 * spacing) <= horizon {
            let due = t0 + (next as f64 * spacing) as i64;
            let s = next % shards;
            // The due time rides in the body too, for businesses that send
            // no headers.
            let body = body_of(&format!("late{due}"), next, size);
            if id_mode {
                let id = format!("late-{next}");
                hsets[s].arg(&id).arg(body);
                zadds[s].arg(due).arg(id);
            } else {
                zadds[s].arg(due).arg(body);
            }
            next += 1;
            any[s] = true;
        }
        for ((zadd, hset), any) in zadds.into_iter().zip(hsets).zip(any) {
            if !any {
                continue;
            }
            let mut pipe = redis::pipe();
            pipe.atomic();
            if id_mode {
                pipe.add_command(hset).ignore();
            }
            pipe.add_command(zadd).ignore();
            let () = pipe
                .query_async(redis)
                .await
                .map_err(|e| fail("redis")(e.to_string()))?;
        }
    }
    // Let the last members come due.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(total)
}

/// Counts, with MONITOR on every master that holds one of `keys`, the
/// commands that name one of them: delayd's own traffic for the business,
/// whatever else the servers are doing.
async fn idle_commands(
    redis: &Redis,
    conn: &RedisConn,
    keys: &[String],
    secs: u64,
) -> Result<u64, BenchError> {
    // MONITOR shows one server's commands.
    let masters = conn
        .masters(redis)
        .await
        .map_err(|e| fail("masters")(e.to_string()))?;
    let mut holders: Vec<&crate::redis_conn::Master> = Vec::new();
    for key in keys {
        let slot = crate::keys::slot(key);
        let master = masters
            .iter()
            .find(|m| m.serves(slot))
            .ok_or_else(|| fail("masters")(format!("no master serves slot {slot}")))?;
        if !holders.iter().any(|h| h.addr == master.addr) {
            holders.push(master);
        }
    }
    let mut streams = Vec::new();
    for master in holders {
        let client = conn
            .subscriber(redis, master)
            .map_err(|e| fail("MONITOR")(e.to_string()))?;
        let monitor = client
            .get_async_monitor()
            .await
            .map_err(|e| fail("MONITOR")(e.to_string()))?;
        streams.push(Box::pin(monitor.into_on_message::<String>()));
    }
    let mut lines = futures::stream::select_all(streams);
    let needles: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
    let end = tokio::time::sleep(Duration::from_secs(secs));
    tokio::pin!(end);
    let mut count = 0u64;
    loop {
        tokio::select! {
            _ = &mut end => break,
            line = lines.next() => match line {
                // Commands a script runs show up too, tagged "lua"; count the calls.
                Some(l) if !l.contains(" lua]") && needles.iter().any(|n| l.contains(n.as_str())) => count += 1,
                Some(_) => {}
                None => return Err(BenchError::Runtime("bench: MONITOR stream ended".into())),
            }
        }
    }
    Ok(count)
}
