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
mod fair;
mod fair_load;
mod fair_release;
mod fair_report;
mod fair_sizes;
mod far_writes;
mod full;
mod idle;
mod intake;
mod lateness;
mod pace;
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
    /// Extra lines for the bench business's intake section, e.g.
    /// "replicas = 1" to measure what waiting for a replica costs.
    #[arg(long, value_name = "TOML", requires = "intake")]
    pub intake_setting: Vec<String>,
    /// Measure what a backlog of this many pending members costs instead of
    /// the drain (Redis memory per task, claim cost, RSS, idle cost), in
    /// body and id mode; repeat for several sizes.
    #[arg(long, value_name = "PENDING", conflicts_with = "intake")]
    pub scale: Vec<usize>,
    /// Also drain the same backlog, every round, from one key and from a
    /// business of this many shards on the same servers, and compare them.
    #[arg(long, value_name = "SHARDS", conflicts_with_all = ["intake", "scale"], value_parser = clap::value_parser!(u16).range(2..=64))]
    pub compare_shards: Option<u16>,
    /// Measure fair release among tenants instead of the drain: a heavy
    /// tenant's burst beside light tenants, with and without tenants and
    /// `max_rate`, then weighted shares (docs/tenants.md).
    #[arg(long, conflicts_with_all = ["intake", "scale", "compare_shards"])]
    pub fair: bool,
    #[command(flatten)]
    pub fair_sizes: fair_sizes::FairSizes,
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
    let ctx = Ctx {
        args: &args,
        cfg: &cfg,
        names: &names,
        client: &client,
        amqp: &amqp,
    };
    let run = async {
        if args.intake {
            intake::bench(&ctx, &mut redis, &mut state).await
        } else if args.fair {
            fair::bench(&ctx, &mut redis, &mut state).await
        } else if !args.scale.is_empty() {
            scale::bench(&ctx, &mut redis, &mut state).await
        } else {
            full::bench(&ctx, &mut redis, &mut state).await
        }
    };
    let outcome = tokio::select! {
        r = run => r,
        _ = signals.next() => Err(BenchError::Runtime("bench interrupted; cleaned up".into())),
    };
    signals.handle().close();
    clean_up(&mut state, &names, &amqp, &mut redis).await;
    let _ = amqp.close(200, "bench done".into()).await;
    outcome
}

/// Removes whatever the run made, whatever happened in it: the daemon it
/// started, its exchanges and queues, its keys and its temporary config.
async fn clean_up(state: &mut BenchState, names: &Names, amqp: &Connection, redis: &mut RedisConn) {
    if let Some(mut child) = state.daemon.take() {
        stop_child(&mut child);
    }
    let ch = amqp.create_channel().await.ok();
    if let Some(ch) = ch {
        delete_topology(&ch, &names.exchange, &names.queue).await;
        for (x, q) in &state.intake_names {
            delete_topology(&ch, x, q).await;
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
            .query_async(redis)
            .await;
    }
    for key in std::mem::take(&mut state.extra_keys) {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query_async(redis).await;
    }
    if let Some(path) = state.config_path.take() {
        let _ = std::fs::remove_file(path);
    }
}

/// Deletes a queue, then an exchange, ignoring what is already gone.
async fn delete_topology(ch: &lapin::Channel, exchange: &str, queue: &str) {
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
}

/// A channel in confirm mode, for a publisher.
/// A channel for a consumer, with at most `prefetch` deliveries unacked.
async fn consumer_channel(amqp: &Connection, prefetch: u16) -> Result<lapin::Channel, BenchError> {
    let ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| fail("qos")(e.to_string()))?;
    Ok(ch)
}

async fn confirm_channel(amqp: &Connection) -> Result<lapin::Channel, BenchError> {
    let ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| fail("confirm_select")(e.to_string()))?;
    Ok(ch)
}

/// Publishes one message on `ch`; its confirm joins `inflight`, to be
/// awaited with the others.
async fn publish_confirmed(
    ch: &lapin::Channel,
    inflight: &mut FuturesUnordered<lapin::PublisherConfirm>,
    (exchange, rk): (&str, &str),
    options: BasicPublishOptions,
    (body, props): (&[u8], BasicProperties),
) -> Result<(), lapin::Error> {
    let confirm = ch
        .basic_publish(exchange.into(), rk.into(), options, body, props)
        .await?;
    inflight.push(confirm);
    Ok(())
}

/// Waits for every confirm still in flight on `ch`, then closes it.
async fn drain_confirms(
    ch: &lapin::Channel,
    inflight: &mut FuturesUnordered<lapin::PublisherConfirm>,
) -> Result<(), lapin::Error> {
    while let Some(r) = inflight.next().await {
        r?;
    }
    let _ = ch.close(200, "done".into()).await;
    Ok(())
}

/// Waits for every publisher task; the first that failed names the error.
async fn join_publishers(
    tasks: Vec<tokio::task::JoinHandle<Result<(), lapin::Error>>>,
    what: &str,
) -> Result<(), BenchError> {
    for t in tasks {
        t.await
            .map_err(|e| fail(what)(e.to_string()))?
            .map_err(|e| fail(what)(e.to_string()))?;
    }
    Ok(())
}

/// What every mode of the bench is given and only reads: the options, the
/// loaded config, the run's names and its connections.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    args: &'a BenchArgs,
    cfg: &'a config::Config,
    names: &'a Names,
    client: &'a Redis,
    amqp: &'a Connection,
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
    /// Keys outside the families that the run wrote (the tenants' sets,
    /// indexes and virtual times of `--fair`).
    extra_keys: Vec<Vec<u8>>,
}

/// An empty `ZADD` on `fam`'s pending set and `HSET` on its body hash, for
/// [`add_member`] to fill.
fn writes_to(fam: &KeyFamily) -> (redis::Cmd, redis::Cmd) {
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(&fam.pending);
    let mut hset = redis::cmd("HSET");
    hset.arg(&fam.body);
    (zadd, hset)
}

/// Adds one member due at `due` to `zadd`: its body, or in id mode the id
/// `id()` names, with the body going to `hset` under it.
fn add_member(
    (zadd, hset): (&mut redis::Cmd, &mut redis::Cmd),
    id_mode: bool,
    due: i64,
    id: impl FnOnce() -> String,
    body: Vec<u8>,
) {
    if id_mode {
        let id = id();
        hset.arg(&id).arg(body);
        zadd.arg(due).arg(id);
    } else {
        zadd.arg(due).arg(body);
    }
}

/// Queues a batch's writes on `pipe`: in id mode the bodies first, so no id
/// is pending without its body.
fn queue_writes(pipe: &mut redis::Pipeline, id_mode: bool, (zadd, hset): (redis::Cmd, redis::Cmd)) {
    if id_mode {
        pipe.add_command(hset).ignore();
    }
    pipe.add_command(zadd).ignore();
}

/// Sends `pipe`, whose replies are all ignored.
async fn send_pipe(redis: &mut RedisConn, pipe: &redis::Pipeline) -> Result<(), BenchError> {
    pipe.query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))
}

fn body_of(tag: &str, i: usize, size: usize) -> Vec<u8> {
    let mut body = format!("{tag}-{i:09}-").into_bytes();
    body.resize(size.max(body.len()), b'x');
    body
}
