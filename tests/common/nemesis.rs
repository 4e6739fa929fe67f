//! The standing nemesis on the intake road in, run over two kinds of Redis:
//! a private standalone server (`tests/intake_nemesis.rs`) and the Sentinel
//! set of `tests/redis_sentinel.rs`. Producers publish with publisher
//! confirms and `x-delay` to an intake exchange that two delayd instances
//! consume, while a seeded schedule of faults hits every part in turn: the
//! instances and a private RabbitMQ node here, Redis by the test's own
//! [`RedisSide`]. At the end every publish the broker confirmed is delivered
//! (at least once) or in the business's dead set with a reason; none is in
//! neither. One publish in 97 is over the intake's `max_message_size`, so
//! the dead road is taken too. Each copy beyond the first must be one that
//! the events `docs/semantics.md` lists account for, as delayd's own
//! counters count them: expired leases recovered, unconfirmed members
//! handed back, publishes nacked, intake deliveries the broker marked
//! redelivered. A run
//! over a business with tenants ([`Tenancy::ByHeader`]) holds the same
//! ends, its publishes spread over tenants by the intake's header, and
//! leaves no tenant in the business's index.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;

use super::*;

/// What the producers sent: a sequence number per publish, and whether
/// the broker confirmed it. Refused (nacked, or no confirm in time) ones
/// were not published as far as a producer knows, but may be delivered.
#[derive(Default)]
pub struct Ledger {
    next: AtomicU64,
    confirmed: Mutex<HashSet<u64>>,
    refused: Mutex<HashSet<u64>>,
}

/// What the consumer of the target queue received: copies per sequence
/// number, and the copies the broker itself redelivered to this consumer
/// (its unacked deliveries across a broker restart), which are not
/// delayd's duplicates.
#[derive(Default)]
pub struct Arrivals {
    copies: Mutex<HashMap<u64, u32>>,
    redelivered: AtomicU64,
}

/// The intake's `max_message_size`: one publish in [`OVERSIZE_EVERY`] is
/// larger and goes to the dead set with its reason, so the dead road is
/// taken under the faults too.
pub const MAX_MESSAGE_SIZE: usize = 4096;
const OVERSIZE_EVERY: u64 = 97;

pub fn oversize(seq: u64) -> bool {
    seq % OVERSIZE_EVERY == OVERSIZE_EVERY - 1
}

/// The body of publish `seq`: its number, then padding to a realistic size
/// (or past `max_message_size`).
fn body(seq: u64) -> Vec<u8> {
    let mut b = format!("nemesis-{seq:010}-").into_bytes();
    b.resize(
        if oversize(seq) {
            MAX_MESSAGE_SIZE + 1000
        } else {
            200
        },
        b'x',
    );
    b
}

fn seq_of(body: &[u8]) -> Option<u64> {
    std::str::from_utf8(body.get(8..18)?).ok()?.parse().ok()
}

/// A connection and a channel in confirm mode, or `None` if the broker
/// does not answer within 2 s at each step. The channel's steps are bounded
/// too: a broker that went away between connecting and opening the channel
/// never answers them.
async fn confirming_channel(url: &str) -> Option<(Connection, Channel)> {
    let conn = answered(
        "a producer's connect",
        Connection::connect(url, Default::default()),
    )
    .await?;
    let ch = answered("a producer's channel open", conn.create_channel()).await?;
    let confirms = ch.confirm_select(ConfirmSelectOptions::default());
    answered("a producer's confirm_select", confirms).await?;
    Some((conn, ch))
}

/// Publishes batches of ten to `exchange` until `stop`, each with
/// `x-delay` between 0 and 3 s and every other one with a `message_id`,
/// persistent, and with `tenancy`'s header, and records which the broker
/// confirmed. Reconnects after any failure; a publish that fails or is not
/// confirmed within 10 s is refused, never retried (a retry would be a new
/// publish).
async fn produce(
    url: String,
    exchange: String,
    tenancy: Tenancy,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::from_os_rng();
    let mut conn: Option<(Connection, Channel)> = None;
    while !stop.load(Ordering::Relaxed) {
        if conn.is_none() {
            conn = confirming_channel(&url).await;
        }
        let Some((_, ch)) = &conn else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut waiting = Vec::new();
        let mut broken = false;
        for _ in 0..10 {
            let seq = ledger.next.fetch_add(1, Ordering::Relaxed);
            let mut h = FieldTable::default();
            h.insert(
                "x-delay".into(),
                AMQPValue::LongInt(rng.random_range(0..=3000)),
            );
            if let Some(tenant) = tenancy.tenant_of(seq) {
                h.insert(TENANT_HEADER.into(), AMQPValue::LongString(tenant.into()));
            }
            let mut props = BasicProperties::default()
                .with_headers(h)
                .with_delivery_mode(2);
            if seq.is_multiple_of(2) {
                props = props.with_message_id(ShortString::from(format!("id-{seq}")));
            }
            let sent = tokio::time::timeout(
                Duration::from_secs(10),
                ch.basic_publish(
                    exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &body(seq),
                    props,
                ),
            )
            .await;
            match sent {
                Ok(Ok(confirm)) => waiting.push((seq, confirm)),
                _ => {
                    ledger.refused.lock().unwrap().insert(seq);
                    broken = true;
                    break;
                }
            }
        }
        for (seq, confirm) in waiting {
            match tokio::time::timeout(Duration::from_secs(10), confirm).await {
                Ok(Ok(c)) if c.is_ack() => ledger.confirmed.lock().unwrap().insert(seq),
                other => {
                    broken |= !matches!(other, Ok(Ok(_)));
                    ledger.refused.lock().unwrap().insert(seq)
                }
            };
        }
        if broken {
            conn = None;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(40..80))).await;
    }
}

/// The value of an AMQP step, or `None` when it failed or got no answer
/// within 2 s; the latter is printed, since an unbounded one once hung a
/// whole run.
async fn answered<T, E>(
    step: &str,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(Duration::from_secs(2), work).await {
        Ok(r) => r.ok(),
        Err(_) => {
            eprintln!("nemesis: {step} got no answer within 2 s");
            None
        }
    }
}

/// Consumes `queue` until `stop`, acknowledging each message once counted,
/// and consumes again on a new connection whenever the broker goes away.
async fn collect(url: String, queue: String, got: Arc<Arrivals>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Some(conn) = answered(
            "the collector's connect",
            Connection::connect(&url, Default::default()),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let Some(ch) = answered("the collector's channel open", conn.create_channel()).await else {
            continue;
        };
        answered(
            "the collector's qos",
            ch.basic_qos(500, BasicQosOptions::default()),
        )
        .await;
        let consume = ch.basic_consume(
            queue.as_str().into(),
            unique("ctag").as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let Some(mut consumer) = answered("the collector's consume", consume).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let d = match tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(d))) => d,
                Ok(_) => break,
            };
            let seq = seq_of(&d.data).expect("a body the producers wrote");
            {
                let mut copies = got.copies.lock().unwrap();
                let n = copies.entry(seq).or_insert(0);
                if d.redelivered && *n > 0 {
                    got.redelivered.fetch_add(1, Ordering::Relaxed);
                } else {
                    *n += 1;
                }
            }
            if answered("the collector's ack", d.ack(BasicAckOptions::default()))
                .await
                .is_none()
            {
                break;
            }
        }
    }
}

/// The Redis the nemesis runs over: how delayd reaches it, how the test
/// reads it, and the faults it can strike on it.
pub trait RedisSide {
    /// Its own faults, each a window after which everything is as before.
    type Fault: Copy + std::fmt::Debug + Eq + std::hash::Hash;
    /// delayd's `[redis]` section.
    fn section(&self) -> String;
    /// A connection to the server that holds the business's keys now.
    fn conn(&self) -> impl Future<Output = MultiplexedConnection>;
    /// Strikes `fault`, its pauses drawn from `rng`, and returns once it is
    /// over.
    fn strike(&mut self, fault: Self::Fault, rng: &mut StdRng) -> impl Future<Output = ()>;
}

/// The faults: on the instances and the broker, or on Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault<R> {
    /// SIGKILL of one delayd instance, restarted after a pause.
    KillInstance,
    /// RabbitMQ stopped (gracefully, or SIGKILL of its VM) and started
    /// again on its data.
    RabbitRestart,
    /// A RabbitMQ memory alarm: every publishing connection blocked.
    MemoryAlarm,
    /// One of the Redis side's faults.
    Redis(R),
}

/// The business the nemesis runs: without tenants, or with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tenancy {
    /// A business without tenants.
    None,
    /// `tenants = true`, each publish in one of [`TENANTS`] tenants named by
    /// the intake's `tenant_header`, or (one in five) in the default tenant.
    ByHeader,
}

/// How many tenants a [`Tenancy::ByHeader`] run spreads its publishes over.
pub const TENANTS: u64 = 4;
const TENANT_HEADER: &str = "x-tenant";

impl Tenancy {
    /// The tenant publish `seq` names, if any.
    fn tenant_of(self, seq: u64) -> Option<String> {
        let t = seq % (TENANTS + 1);
        (self == Tenancy::ByHeader && t < TENANTS).then(|| format!("tenant-{t}"))
    }

    /// The business's settings, and its intake section's, for this tenancy.
    fn settings(self) -> (&'static str, String) {
        match self {
            Tenancy::None => ("", String::new()),
            Tenancy::ByHeader => (
                "tenants = true\n",
                format!("tenant_header = \"{TENANT_HEADER}\"\n"),
            ),
        }
    }
}

/// What delayd's counters say could have cost a duplicate, summed over
/// every instance's life (an instance is read just before it is killed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    /// `delayd_recovered_total`: expired leases moved back to pending.
    pub recovered: u64,
    /// `delayd_released_total`: unconfirmed members handed back.
    pub released: u64,
    /// `delayd_intake_redelivered_total`: intake deliveries the broker
    /// marked redelivered.
    pub redelivered: u64,
    /// `delayd_nacked_total`: publishes the broker nacked, retried. A
    /// queue that goes down with publishes unconfirmed (a broker stop, a
    /// queue process crash) nacks them all, though it may have stored some.
    pub nacked: u64,
}

impl Counted {
    /// The most duplicates these events can account for.
    pub fn bound(&self) -> u64 {
        self.recovered + self.released + self.redelivered + self.nacked
    }

    fn add(&mut self, o: Counted) {
        self.recovered += o.recovered;
        self.released += o.released;
        self.redelivered += o.redelivered;
        self.nacked += o.nacked;
    }

    /// The counters of the instance serving /metrics at `port`, for the
    /// business `name`, read in one scrape. An instance that does not
    /// answer three times (5 s each) fails the run: counting it as zeros would make
    /// the bound smaller than what happened.
    async fn read(port: u16, name: &str) -> Counted {
        let mut body = None;
        for _ in 0..3 {
            body = tokio::task::spawn_blocking(move || super::http_get(port, "/metrics"))
                .await
                .unwrap()
                .map(|(_, b)| b);
            if body.is_some() {
                break;
            }
        }
        let body = body.unwrap_or_else(|| {
            panic!("the instance at metrics port {port} did not answer /metrics three times")
        });
        let of = |metric: &str| super::sample(&body, &format!("{metric}{{business=\"{name}\"}}"));
        Counted {
            recovered: of("delayd_recovered_total"),
            released: of("delayd_released_total"),
            redelivered: of("delayd_intake_redelivered_total"),
            nacked: of("delayd_nacked_total"),
        }
    }
}

/// The business the nemesis runs, and its instances' config.
const BUSINESS: &str = "delayed";

/// What RabbitMQ's own log (`DIR/log/`, deploy/local/rabbitmq-lib.sh) says
/// of recovering its queues after a stop: a loss after a SIGKILL of its VM
/// is then told apart from one in delayd.
fn broker_recovery(dir: &std::path::Path) -> String {
    let words = ["unclean shutdown", "dropped", "crashed queue", "Restarting"];
    let lines: Vec<String> = std::fs::read_dir(dir.join("log"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|f| {
            std::fs::read_to_string(f.path())
                .unwrap_or_default()
                .lines()
                .filter(|l| words.iter().any(|w| l.contains(w)))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    match lines.is_empty() {
        true => "(nothing)".into(),
        false => lines[lines.len().saturating_sub(20)..].join("\n"),
    }
}

/// The servers and instances the nemesis strikes.
struct World<R> {
    redis: R,
    rabbit: PrivateRabbit,
    config: PathBuf,
    instances: Vec<Daemon>,
    /// Every instance's log, also of those killed.
    logs: Vec<PathBuf>,
    /// The counters of the instances killed so far.
    counted: Counted,
    rng: StdRng,
}

impl<R: RedisSide> World<R> {
    async fn pause(&mut self, ms: std::ops::Range<u64>) {
        let ms = self.rng.random_range(ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn start_instance(&mut self) -> Daemon {
        let d = Daemon::start(&self.config);
        self.logs.push(d.log.clone());
        d
    }

    /// What the counters of every instance, killed or running, say.
    async fn counted(&self) -> Counted {
        let mut all = self.counted;
        for d in &self.instances {
            all.add(Counted::read(d.metrics_port().await, BUSINESS).await);
        }
        all
    }

    async fn strike(&mut self, fault: Fault<R::Fault>) {
        match fault {
            Fault::KillInstance => {
                let i = self.rng.random_range(0..self.instances.len());
                let port = self.instances[i].metrics_port().await;
                self.counted.add(Counted::read(port, BUSINESS).await);
                self.instances[i].kill();
                self.pause(200..2000).await;
                self.instances[i] = self.start_instance();
            }
            Fault::RabbitRestart => {
                if self.rng.random_bool(0.5) {
                    eprintln!("nemesis: RabbitMQ's VM SIGKILLed");
                    self.rabbit.kill().await;
                } else {
                    self.rabbit.stop().await;
                }
                self.pause(1000..3000).await;
                self.rabbit.start().await;
            }
            Fault::MemoryAlarm => {
                let ms = self.rng.random_range(2000..4000);
                let alarm = Alarm(&self.rabbit);
                alarm.raise().await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                alarm.clear().await;
            }
            Fault::Redis(f) => self.redis.strike(f, &mut self.rng).await,
        }
    }

    /// Panics with the daemon's log unless every instance is running.
    fn assert_running(&mut self) {
        for d in &mut self.instances {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!("delayd exited ({status}); log:\n{}", d.tail());
            }
        }
    }

    /// The WARN and ERROR lines of every instance's log, the last 60.
    fn complaints(&self) -> String {
        let lines: Vec<String> = self
            .logs
            .iter()
            .flat_map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                    .filter(|l| !l.contains("too large"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

/// How long the run lasts: one pass over the faults, or cycles of them for
/// `DELAYD_NEMESIS_SECS`; and the seed (`DELAYD_NEMESIS_SEED`, or random).
fn plan() -> (Option<u64>, u64) {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}"))
        })
    };
    (
        var("DELAYD_NEMESIS_SECS"),
        var("DELAYD_NEMESIS_SEED").unwrap_or_else(rand::random),
    )
}
/// Runs the nemesis over `redis` with `faults` (one pass in a seeded
/// order, or cycles of them for `DELAYD_NEMESIS_SECS`), a private RabbitMQ
/// node in `dir`, and checks the end: every confirmed publish delivered or
/// dead with its reason, and no more duplicates than delayd's counters
/// account for, over a business of `tenancy`. `what` names the run in what
/// it prints.
pub async fn run<R: RedisSide>(
    what: &str,
    redis: R,
    dir: &Path,
    faults: &[Fault<R::Fault>],
    tenancy: Tenancy,
) {
    let (secs, seed) = plan();
    eprintln!("{what}: seed {seed} (DELAYD_NEMESIS_SEED={seed} replays the schedule)");
    let started = Instant::now();
    let mut rabbit = PrivateRabbit::new(dir);
    rabbit.start().await;
    let amqp = amqp_at(&rabbit.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (target, queue, intake) = ("nemesis-target", "nemesis-q", "nemesis-intake");
    declare(&ch, target, queue, "").await;
    let key = unique("test:nemesis");
    // A short lease: what a killed instance had claimed is recovered
    // within seconds, so the run settles soon after the last publish.
    let (tenants, intake_tenants) = tenancy.settings();
    let spec = BusinessSpec {
        name: BUSINESS.into(),
        key: key.clone(),
        exchange: target.into(),
        routing_key: String::new(),
        extra: format!(
            "properties = \"standard\"\nlease = \"5s\"\nretry_backoff = \"100ms\"\n{tenants}[businesses.{BUSINESS}.intake]\nexchange = \"{intake}\"\nqueue = \"{intake}.q\"\nmax_message_size = {MAX_MESSAGE_SIZE}\n{intake_tenants}"
        ),
    };
    let config = write_config_redis(
        dir,
        &redis.section(),
        &rabbit.url(),
        "127.0.0.1:0",
        &[&spec],
    );
    let mut world = World {
        redis,
        rabbit,
        config,
        instances: Vec::new(),
        logs: Vec::new(),
        counted: Counted::default(),
        rng: StdRng::seed_from_u64(seed),
    };
    for _ in 0..2 {
        let d = world.start_instance();
        world.instances.push(d);
    }
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &world.instances[0]).await;
    drop(ch);
    drop(amqp);

    let ledger = Arc::new(Ledger::default());
    let got = Arc::new(Arrivals::default());
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(produce(
                world.rabbit.url(),
                intake.to_string(),
                tenancy,
                ledger.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let collector = tokio::spawn(collect(
        world.rabbit.url(),
        queue.to_string(),
        got.clone(),
        done.clone(),
    ));

    // The schedule: passes over every fault, each pass in its own order.
    let mut struck: Vec<Fault<R::Fault>> = Vec::new();
    let nemesis = Instant::now();
    loop {
        let mut pass = faults.to_vec();
        rand::seq::SliceRandom::shuffle(&mut pass[..], &mut world.rng);
        for fault in pass {
            world.pause(1000..2500).await;
            let t = Instant::now();
            // A fault that never ends fails the run with its seed, rather
            // than hanging it (seen once in a whole run, cause not found).
            if tokio::time::timeout(Duration::from_secs(90), world.strike(fault))
                .await
                .is_err()
            {
                panic!(
                    "seed {seed}: {fault:?} did not end within 90 s; complaints:\n{}",
                    world.complaints()
                );
            }
            eprintln!("{what}: {fault:?} for {:?}", t.elapsed());
            struck.push(fault);
            world.assert_running();
        }
        if secs.is_none_or(|s| nemesis.elapsed() >= Duration::from_secs(s)) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        within(seed, "the producers' stop", 30, p).await.unwrap();
    }
    let producing = nemesis.elapsed();

    // Every confirmed publish delivered or dead; bounded.
    let confirmed = ledger.confirmed.lock().unwrap().clone();
    let refused = ledger.refused.lock().unwrap().clone();
    let mut conn = within(seed, "connecting to Redis", 30, world.redis.conn()).await;
    let settling = Instant::now();
    let settled = eventually(Duration::from_secs(120), || {
        let (got, mut conn, key, confirmed) = (got.clone(), conn.clone(), key.clone(), &confirmed);
        async move {
            let delivered = got.copies.lock().unwrap().clone();
            let missing: Vec<u64> = confirmed
                .iter()
                .filter(|s| !delivered.contains_key(*s))
                .copied()
                .collect();
            missing.is_empty() || {
                let dead = within(seed, "reading the dead set", 10, dead(&mut conn, &key)).await;
                missing.iter().all(|s| dead.contains_key(s))
            }
        }
    })
    .await;
    let settling = settling.elapsed();
    // Late copies (a redelivery after the last one needed) are counted too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    done.store(true, Ordering::Relaxed);
    within(seed, "the collector's stop", 30, collector)
        .await
        .unwrap();

    let delivered = got.copies.lock().unwrap().clone();
    let dead = within(seed, "reading the dead set", 10, dead(&mut conn, &key)).await;
    let counted = within(seed, "reading the counters", 60, world.counted()).await;
    let lost: Vec<u64> = {
        let mut l: Vec<u64> = confirmed
            .iter()
            .filter(|s| !delivered.contains_key(*s) && !dead.contains_key(*s))
            .copied()
            .collect();
        l.sort();
        l
    };
    let duplicates: u32 = delivered.values().map(|n| n - 1).sum();
    let unknown: Vec<u64> = delivered
        .keys()
        .chain(dead.keys())
        .filter(|s| !confirmed.contains(*s) && !refused.contains(*s))
        .copied()
        .collect();
    let mut counts: HashMap<Fault<R::Fault>, usize> = HashMap::new();
    for f in &struck {
        *counts.entry(*f).or_default() += 1;
    }
    eprintln!(
        "{what}: seed {seed}; {} s of publishing, faults {counts:?}; {} publishes confirmed, {} refused; \
         {} confirmed delivered, {} refused delivered anyway; {} duplicate copies from delayd, {} redelivered \
         to the consumer by the broker; counted {} ({} leases recovered, {} released, {} intake redeliveries, {} nacked); \
         {} dead ({} not for being too large); {} lost; settled {} s after the last publish; {} s in all",
        producing.as_secs(),
        confirmed.len(),
        refused.len(),
        confirmed.iter().filter(|s| delivered.contains_key(*s)).count(),
        refused.iter().filter(|s| delivered.contains_key(*s)).count(),
        duplicates,
        got.redelivered.load(Ordering::Relaxed),
        counted.bound(),
        counted.recovered,
        counted.released,
        counted.redelivered,
        counted.nacked,
        dead.len(),
        dead.keys().filter(|s| !oversize(**s)).count(),
        lost.len(),
        settling.as_secs(),
        started.elapsed().as_secs(),
    );
    if !settled || !lost.is_empty() {
        let whereabouts = whereabouts(&mut conn, &key, &lost).await;
        let amqp = amqp_at(&world.rabbit.url()).await;
        let waiting = queue_depth(&amqp, &format!("{intake}.q")).await;
        panic!(
            "seed {seed}: {} of {} confirmed publishes neither delivered nor dead (first: {:?}); \
             where they are: {whereabouts}; {waiting} messages wait in the intake queue; \
             what RabbitMQ logged of its queues' recovery:\n{}\ncomplaints in the logs:\n{}",
            lost.len(),
            confirmed.len(),
            &lost[..lost.len().min(20)],
            broker_recovery(&world.rabbit.dir),
            world.complaints()
        );
    }
    assert!(
        unknown.is_empty(),
        "delivered or dead but never published: {:?}",
        &unknown[..unknown.len().min(20)]
    );
    assert!(
        u64::from(duplicates) <= counted.bound(),
        "seed {seed}: {duplicates} duplicates, more than the events that may cost one account for ({counted:?}); \
         complaints in the logs:\n{}",
        world.complaints()
    );
    // Dead with a reason, and the oversized ones for being too large.
    for (seq, reason) in &dead {
        assert!(
            !reason.is_empty() && (!oversize(*seq) || reason.contains("too large")),
            "publish {seq} is dead: {reason:?}"
        );
    }
    if tenancy == Tenancy::ByHeader {
        let left = members(&mut conn, &family(&key).tenant_index()).await;
        assert!(
            left.is_empty(),
            "seed {seed}: every publish settled, yet the tenant index still names {:?}",
            left.iter()
                .map(|t| String::from_utf8_lossy(t))
                .collect::<Vec<_>>()
        );
    }
    let oversized: Vec<u64> = confirmed
        .iter()
        .filter(|s| oversize(**s))
        .copied()
        .collect();
    assert!(!oversized.is_empty(), "no oversized publish was confirmed");
    for seq in oversized {
        assert!(
            !delivered.contains_key(&seq),
            "oversized publish {seq} was delivered"
        );
    }
    world.assert_running();
}

/// The sequence number of each id in `ids`, read from its stored envelope.
async fn seqs_of(
    c: &mut redis::aio::MultiplexedConnection,
    body_hash: &str,
    ids: &[Vec<u8>],
) -> HashMap<Vec<u8>, u64> {
    let mut out = HashMap::new();
    for id in ids {
        let env: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(body_hash)
            .arg(id)
            .query_async(c)
            .await
            .unwrap();
        let seq = env
            .as_deref()
            .and_then(delayd::message::envelope::decode)
            .and_then(|e| seq_of(e.body));
        if let Some(seq) = seq {
            out.insert(id.clone(), seq);
        }
    }
    out
}

async fn members(
    c: &mut redis::aio::MultiplexedConnection,
    key: impl redis::ToRedisArgs,
) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(c)
        .await
        .unwrap()
}

/// The dead intake messages by sequence number, each with its reason.
async fn dead(c: &mut redis::aio::MultiplexedConnection, key: &str) -> HashMap<u64, String> {
    let f = family(key);
    let ids = members(c, &f.dead).await;
    let seqs = seqs_of(c, &f.body, &ids).await;
    let mut out = HashMap::new();
    for id in ids {
        let reason: Option<String> = redis::cmd("HGET")
            .arg(&f.reasons)
            .arg(&id)
            .query_async(c)
            .await
            .unwrap();
        let seq = seqs.get(&id).unwrap_or_else(|| {
            panic!(
                "dead id {} has no readable envelope (dead for {reason:?})",
                String::from_utf8_lossy(&id)
            )
        });
        out.insert(*seq, reason.unwrap_or_default());
    }
    out
}

/// Awaits `work`, or fails the run naming its seed and `phase` after
/// `secs`: a hang prints nothing (a whole run once hung after the faults,
/// every thread parked), a failure prints the seed that replays it.
async fn within<T>(
    seed: u64,
    phase: &str,
    secs: u64,
    work: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), work).await {
        Ok(v) => v,
        Err(_) => panic!("seed {seed}: {phase} did not end within {secs} s"),
    }
}

/// Where the `lost` sequence numbers are, for the failure message: pending
/// in `K` or in a tenant's set, in flight, or nowhere delayd keeps them.
async fn whereabouts(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    lost: &[u64],
) -> String {
    let f = family(key);
    let lost: HashSet<u64> = lost.iter().copied().collect();
    let mut out = Vec::new();
    let mut sets: Vec<(String, Vec<u8>)> = vec![
        ("pending".into(), f.pending.clone().into_bytes()),
        ("in flight".into(), f.inflight.clone().into_bytes()),
    ];
    for tenant in members(conn, &f.tenant_index()).await {
        let name = format!("in tenant {}'s set", String::from_utf8_lossy(&tenant));
        sets.push((name, f.tenant_set(&tenant)));
    }
    for (name, set) in sets {
        let ids = members(conn, &set).await;
        let here = seqs_of(conn, &f.body, &ids)
            .await
            .into_values()
            .filter(|s| lost.contains(s))
            .count();
        out.push(format!("{here} {name}"));
    }
    out.join(", ")
}
