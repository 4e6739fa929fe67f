//! delayd in sentinel mode on real sentinels: a master, a replica and three
//! sentinels (quorum 2, down-after 1000, 1400 and 1800 ms) started once for
//! this test binary by `deploy/local/redis-sentinel.sh`, plus a set of their
//! own for the password test. A drain (also with the replica stopped again
//! and again), the master killed mid-flow, keyspace wake-ups that follow a
//! failover, a failover held back by a vote, a wrong `master_name`,
//! passwords that stay out of the logs, the intake waiting for the replica,
//! and the intake nemesis (`common::nemesis`) with a replica that lags. The
//! tests take turns: several of them fail the master over, and each starts
//! by bringing a killed node back as a replica.

use delayd_test_support as common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::nemesis::{self, Fault, RedisSide};
use common::*;
use redis::aio::MultiplexedConnection;

/// One master, one replica and three sentinels monitoring it as "main".
struct Sentinels {
    dir: PathBuf,
    base: u16,
    /// The data nodes' password, if they require one.
    password: Option<String>,
    /// The sentinels' own password, if they require one.
    sentinel_password: Option<String>,
}

static SHARED: OnceLock<Sentinels> = OnceLock::new();
/// One test at a time: failovers change what the others see, and the
/// wake-up timings need the machine's attention.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn on the shared set, healed of what an earlier test did
/// to it.
async fn healed_turn() -> (tokio::sync::MutexGuard<'static, ()>, &'static Sentinels) {
    let turn = SERIAL.lock().await;
    let s = shared();
    s.heal();
    (turn, s)
}

/// The shared set, started on first use and stopped by the script's watcher
/// when this test process exits, however it exits.
fn shared() -> &'static Sentinels {
    SHARED.get_or_init(|| Sentinels::start(None, None))
}

impl Sentinels {
    fn start(password: Option<String>, sentinel_password: Option<String>) -> Self {
        let dir = tempfile::tempdir().unwrap().keep();
        // The master, the replica and the sentinels on base..base+4.
        let base = free_port(27000..29995, &[1, 2, 3, 4]);
        let mut env = Vec::new();
        if let Some(p) = &password {
            env.push(("DELAYD_REDIS_PASSWORD", p.clone()));
        }
        if let Some(p) = &sentinel_password {
            env.push(("DELAYD_SENTINEL_PASSWORD", p.clone()));
        }
        run_script(
            "redis-sentinel.sh",
            &[
                "start",
                dir.to_str().unwrap(),
                &base.to_string(),
                &std::process::id().to_string(),
            ],
            &env,
        );
        Sentinels {
            dir,
            base,
            password,
            sentinel_password,
        }
    }

    fn sentinel_ports(&self) -> [u16; 3] {
        [self.base + 2, self.base + 3, self.base + 4]
    }

    /// The `[redis]` section for delayd, with the master's password in the
    /// sentinels' URLs (delayd's convention) and `sentinel_password`.
    fn section(&self, master_name: &str) -> String {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let urls: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| format!("\"redis://{auth}127.0.0.1:{p}\""))
            .collect();
        let mut s = format!(
            "[redis]\nmode = \"sentinel\"\nurls = [{}]\nmaster_name = \"{master_name}\"\n",
            urls.join(", ")
        );
        if let Some(p) = &self.sentinel_password {
            s.push_str(&format!("sentinel_password = \"{p}\"\n"));
        }
        s
    }

    fn url(&self, port: u16, password: &Option<String>) -> String {
        match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{port}"),
            None => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// The master's port as the first answering sentinel names it.
    async fn named_master(&self) -> Option<u16> {
        for p in self.sentinel_ports() {
            let Ok(mut c) = connect(&self.url(p, &self.sentinel_password)).await else {
                continue;
            };
            if let Ok(Some((_, port))) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("main")
                .query_async::<Option<(String, u16)>>(&mut c)
                .await
            {
                return Some(port);
            }
        }
        None
    }

    /// A connection to the master, found the way any sentinel client finds
    /// it (independently of delayd's code): ask, connect, check the role.
    async fn master(&self) -> Option<MultiplexedConnection> {
        let port = self.named_master().await?;
        let mut c = connect(&self.url(port, &self.password)).await.ok()?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.ok()?;
        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master").then_some(c)
    }

    /// Like [`Sentinels::master`], retried for up to 30 s.
    async fn master_conn(&self) -> MultiplexedConnection {
        let start = Instant::now();
        loop {
            if let Some(c) = self.master().await {
                return c;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no master reachable through the sentinels"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the sentinels name a master other than `old`; panics
    /// after `limit`.
    async fn wait_switch(&self, old: u16, limit: Duration) -> u16 {
        let start = Instant::now();
        loop {
            if let Some(p) = self.named_master().await {
                if p != old {
                    return p;
                }
            }
            assert!(
                start.elapsed() < limit,
                "the sentinels did not fail over from :{old} within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The sentinels' failover events from their logs (down, votes,
    /// election, promotion, aborts), to tell a slow failover from a slow
    /// follower when a bound is missed.
    fn events(&self) -> String {
        let marks = [
            "sdown",
            "odown",
            "failover",
            "elected",
            "vote",
            "promoted",
            "switch-master",
            "epoch",
        ];
        let mut out = String::new();
        for p in self.sentinel_ports() {
            let log = std::fs::read_to_string(self.dir.join(p.to_string()).join("sentinel.log"))
                .unwrap_or_default();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| marks.iter().any(|m| l.contains(m)))
                .collect();
            out.push_str(&format!("sentinel :{p}:\n"));
            for l in &lines[lines.len().saturating_sub(25)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    fn kill_node(&self, port: u16) {
        run_script(
            "redis-sentinel.sh",
            &["kill-node", self.dir.to_str().unwrap(), &port.to_string()],
            &[],
        );
    }

    /// Brings back any node a test killed, as a replica, and waits until
    /// the set is ready: whichever node is master, the other replicates it.
    fn heal(&self) {
        run_script(
            "redis-sentinel.sh",
            &["heal", self.dir.to_str().unwrap()],
            &[],
        );
    }

    fn stop(&self) {
        run_script(
            "redis-sentinel.sh",
            &["stop", self.dir.to_str().unwrap()],
            &[],
        );
    }
}

/// A set of sentinels of its own, stopped when the test ends (also when
/// it fails).
struct Private(Sentinels);

impl Drop for Private {
    fn drop(&mut self) {
        self.0.stop();
    }
}

async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    match tokio::time::timeout(
        Duration::from_secs(3),
        client.get_multiplexed_async_connection_with_config(&slow_ok()),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
    }
}

/// `ZADD` then `WAIT 1`: true only when the member reached the replica,
/// the producer's way of knowing a failover cannot take it back. With a
/// tenant, the member goes into its set and the tenant into the index in
/// one `MULTI`, as producers write a business with tenants.
async fn zadd_replicated(
    c: &mut MultiplexedConnection,
    (key, tenant): (&str, Option<&str>),
    due: i64,
    body: &str,
) -> bool {
    let mut p = redis::pipe();
    match tenant {
        None => {
            p.cmd("ZADD").arg(key).arg(due).arg(body).ignore();
        }
        Some(t) => {
            let f = family(key);
            p.cmd("MULTI").ignore();
            p.cmd("ZADD")
                .arg(f.tenant_set(t.as_bytes()))
                .arg(due)
                .arg(body)
                .ignore();
            p.cmd("ZADD")
                .arg(f.tenant_index())
                .arg("LT")
                .arg(due)
                .arg(t)
                .ignore();
            p.cmd("EXEC").ignore();
        }
    }
    p.cmd("WAIT").arg(1).arg(200);
    matches!(p.query_async::<(i64,)>(c).await, Ok((n,)) if n >= 1)
}

/// A business in sentinel mode with a consumer on its queue.
struct Flow {
    _consumers: Arc<Consumers>,
    b: BusinessSpec,
    config: PathBuf,
    inbox: Inbox,
}

async fn flow(s: &Sentinels, name: &str, extra: &str) -> Flow {
    let b = BusinessSpec::with_extra(name, extra);
    flows(s, vec![b]).await.pop().unwrap()
}

/// One flow per business, all in one config a daemon serves together.
async fn flows(s: &Sentinels, bs: Vec<BusinessSpec>) -> Vec<Flow> {
    let refs: Vec<&BusinessSpec> = bs.iter().collect();
    let c = Consumers::on(&amqp_url(), &refs).await;
    let config = write_config_redis(c.dir.path(), &s.section("main"), &amqp_url(), "off", &refs);
    let c = Arc::new(c);
    bs.into_iter()
        .zip(c.inboxes.clone())
        .map(|(b, inbox)| Flow {
            _consumers: c.clone(),
            b,
            config: config.clone(),
            inbox,
        })
        .collect()
}

impl Flow {
    /// Waits until every one of `want` arrived at least once; panics with
    /// the missing count and the daemon's log after `limit`.
    async fn wait_all(&self, want: &[String], limit: Duration, daemon: &Daemon) {
        let start = Instant::now();
        loop {
            let seen = counts(&self.inbox);
            let missing: Vec<&String> = want
                .iter()
                .filter(|m| !seen.contains_key(m.as_bytes()))
                .collect();
            if missing.is_empty() {
                return;
            }
            if start.elapsed() > limit {
                panic!(
                    "{} of {} members never arrived within {limit:?} (first: {:?}); log:\n{}",
                    missing.len(),
                    want.len(),
                    &missing[..missing.len().min(5)],
                    daemon.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until no key of the family is left on the current master,
    /// the tenants' index and virtual times included.
    async fn assert_family_gone(&self, s: &Sentinels) {
        let key = self.b.key.clone();
        let gone = eventually(Duration::from_secs(30), || {
            let key = key.clone();
            async move {
                let Some(mut c) = s.master().await else {
                    return false;
                };
                family_empty(&mut c, &key).await
            }
        })
        .await;
        assert!(gone, "key family of {key} not empty");
    }
}

fn duplicates(inbox: &Inbox) -> usize {
    counts(inbox).values().map(|n| n - 1).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_through_sentinel_delivers_every_member_exactly_once_and_empties_the_family() {
    let _turn = SERIAL.lock().await;
    drain(shared(), "drain", 1000, |_| async {}).await;
}

/// The scanners claim, publish and ack on the master whatever its replica
/// does: stopped (SIGSTOP) for 0.5 to 2 s again and again while members
/// fall due over 8 s, it costs no duplicate and keeps nothing behind, for a
/// business without tenants and one with them alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_while_the_replica_lags_again_and_again_delivers_every_member_exactly_once_and_empties_the_family(
) {
    let _turn = SERIAL.lock().await;
    drain(shared(), "lagdrain", 8000, |s| async move {
        use rand::Rng;
        let (_, replica) = replica_port(s).await;
        let mut rng = rand::rng();
        for _ in 0..5 {
            let stalled = Stalled::node(s, replica);
            let ms = rng.random_range(500..2000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            drop(stalled);
            let ms = rng.random_range(300..1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    })
    .await;
}

/// 2000 members due over `spread_ms` in each of two businesses, one without
/// tenants (members in `K`) and one with (members spread over four tenants'
/// sets), drained by one daemon with two scanners each while `meanwhile`
/// runs: each delivered once, both families gone.
async fn drain<F, Fut>(s: &'static Sentinels, name: &str, spread_ms: i64, meanwhile: F)
where
    F: FnOnce(&'static Sentinels) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    s.heal();
    let mut c = s.master_conn().await;
    let flows = flows(
        s,
        vec![
            BusinessSpec::with_extra(name, "scanners = 2"),
            BusinessSpec::with_extra(&format!("{name}_tenants"), "scanners = 2\ntenants = true"),
        ],
    )
    .await;
    let now = redis_now_ms(&mut c).await;
    let want: Vec<String> = (0..2000).map(|i| format!("m-{i}")).collect();
    let items: Vec<(f64, Vec<u8>)> = want
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let due = now + i as i64 * spread_ms / want.len() as i64;
            (due as f64, m.clone().into_bytes())
        })
        .collect();
    zadd_many(&mut c, &flows[0].b.key, &items).await;
    for t in 0..4 {
        let mine: Vec<(f64, Vec<u8>)> = items.iter().skip(t).step_by(4).cloned().collect();
        zadd_tenant(&mut c, &flows[1].b.key, &format!("t{t}"), &mine).await;
    }
    let daemon = Daemon::start(&flows[0].config);
    meanwhile(s).await;
    let want_bodies: std::collections::HashSet<Vec<u8>> =
        want.iter().map(|m| m.as_bytes().to_vec()).collect();
    for f in &flows {
        f.wait_all(&want, Duration::from_secs(60), &daemon).await;
    }
    for f in &flows {
        f.inbox.settle(Duration::from_millis(500)).await;
        f.inbox
            .assert_each_once(&want_bodies, &format!("a clean run of {}", f.b.name));
        f.assert_family_gone(s).await;
    }
    let log = daemon.logs();
    assert!(!log.contains("panicked"), "{log}");
}

/// What the test's producer did with one member.
struct Produced {
    body: String,
    /// When its ZADD was sent (wall ms).
    sent_ms: i64,
    /// ZADD answered and `WAIT 1` saw the replica take it.
    acked: bool,
}

/// ZADDs members due now, as fast as one connection goes with a `WAIT` per
/// member, re-finding the master through the sentinels after any error,
/// until `stop`.
/// A producer writing `p-<i>` due at once every 5 ms until `stop`, into
/// tenant `t<i mod 3>` when `tenants`.
fn produce(
    s: &'static Sentinels,
    (key, tenants): (String, bool),
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Vec<Produced>>>, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let out = log.clone();
    let task = tokio::spawn(async move {
        let mut conn: Option<MultiplexedConnection> = None;
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let Some(c) = conn.as_mut() else {
                conn = s.master().await;
                if conn.is_none() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            };
            let body = format!("p-{i}");
            let tenant = tenants.then(|| format!("t{}", i % 3));
            i += 1;
            let sent_ms = wall_ms();
            let acked = zadd_replicated(c, (&key, tenant.as_deref()), sent_ms, &body).await;
            if !acked {
                conn = None;
            }
            out.lock().unwrap().push(Produced {
                body,
                sent_ms,
                acked,
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (log, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_mid_flow_loses_no_acknowledged_member_and_resumes_within_10s() {
    kill_the_master_mid_flow("kill", false).await;
}

/// The same kill on a business with tenants: the backlog and the
/// producer's members wait in three tenants' sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_mid_flow_of_a_business_with_tenants_loses_no_acknowledged_member_and_resumes_within_10s(
) {
    kill_the_master_mid_flow("kill_tenants", true).await;
}

/// A backlog of 1,500 due over 6 s and a producer adding members acked
/// once the replica holds them; the master SIGKILLed mid-flow: every
/// acked member is delivered, delivery resumes within 10 s of the kill,
/// and the family is left empty.
async fn kill_the_master_mid_flow(name: &str, tenants: bool) {
    let (_turn, s) = healed_turn().await;
    let extra = if tenants {
        "scanners = 2\nlease = \"3s\"\ntenants = true"
    } else {
        "scanners = 2\nlease = \"3s\""
    };
    let f = flow(s, name, extra).await;
    // A backlog due over the next 6 s, then a producer that keeps adding.
    let mut c = s.master_conn().await;
    let now = redis_now_ms(&mut c).await;
    let backlog: Vec<String> = (0..1500).map(|i| format!("b-{i}")).collect();
    let items: Vec<(f64, Vec<u8>)> = backlog
        .iter()
        .enumerate()
        .map(|(i, m)| ((now + i as i64 * 4) as f64, m.clone().into_bytes()))
        .collect();
    if tenants {
        for t in 0..3 {
            let mine: Vec<(f64, Vec<u8>)> = items.iter().skip(t).step_by(3).cloned().collect();
            zadd_tenant(&mut c, &f.b.key, &format!("t{t}"), &mine).await;
        }
    } else {
        zadd_many(&mut c, &f.b.key, &items).await;
    }
    let synced: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(synced, 1, "the backlog did not reach the replica");
    let daemon = Daemon::start(&f.config);
    f.inbox.wait_for(200, Duration::from_secs(30)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (produced, producer) = produce(s, (f.b.key.clone(), tenants), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let victim = s.named_master().await.expect("no master named");
    s.kill_node(victim);
    // After the kill: a ZADD sent from now on can only land on a new master.
    let killed_at = wall_ms();
    let new_master = s.wait_switch(victim, Duration::from_secs(30)).await;
    let switched_ms = wall_ms() - killed_at;
    // The old master comes back as a replica, so WAIT can succeed again.
    s.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();

    let produced = std::mem::take(&mut *produced.lock().unwrap());
    let acked: Vec<String> = produced
        .iter()
        .filter(|p| p.acked)
        .map(|p| p.body.clone())
        .collect();
    let after_kill = produced
        .iter()
        .filter(|p| p.acked && p.sent_ms > killed_at)
        .count();
    assert!(
        after_kill > 50,
        "the producer got only {after_kill} members acknowledged after the kill"
    );
    let want: Vec<String> = backlog.iter().cloned().chain(acked.clone()).collect();
    f.wait_all(&want, Duration::from_secs(60), &daemon).await;
    f.inbox.settle(Duration::from_millis(500)).await;

    // Resumed: the first delivery of a member the producer sent after the kill.
    let sent_after: std::collections::HashSet<&str> = produced
        .iter()
        .filter(|p| p.sent_ms > killed_at)
        .map(|p| p.body.as_str())
        .collect();
    let resumed = f
        .inbox
        .all()
        .iter()
        .filter(|r| sent_after.contains(std::str::from_utf8(&r.body).unwrap_or("")))
        .map(|r| r.at_ms)
        .min()
        .expect("nothing sent after the kill was delivered")
        - killed_at;
    let unacked = produced.iter().filter(|p| !p.acked).count();
    let seen = counts(&f.inbox);
    let unacked_delivered = produced
        .iter()
        .filter(|p| !p.acked && seen.contains_key(p.body.as_bytes()))
        .count();
    let dups = duplicates(&f.inbox);
    eprintln!(
        "master :{victim} killed; sentinels named :{new_master} after {switched_ms} ms; \
         delivery resumed {resumed} ms after the kill; {} members acknowledged \
         ({after_kill} after the kill), all delivered; {unacked} unacknowledged \
         ({unacked_delivered} of them delivered); {dups} duplicate deliveries",
        want.len()
    );
    assert!(
        resumed <= 10_000,
        "delivery resumed {resumed} ms after the master died (the sentinels named \
         :{new_master} after {switched_ms} ms); log:\n{}\nsentinels' events:\n{}",
        daemon.logs(),
        s.events()
    );
    f.assert_family_gone(s).await;
    let log = daemon.logs();
    assert!(!log.contains("panicked"), "{log}");
}

/// A sentinel that voted for another's failover try starts none of its own
/// for twice `failover-timeout` (20 s here), even when the try came to
/// nothing: a loaded sentinel that misses a new master's pings right after
/// a switch makes such a try. The set is ready only once that has passed,
/// so a master killed after `heal` is failed over as promptly as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_vote_for_a_failover_try_that_came_to_nothing_the_set_is_ready_only_once_the_sentinels_can_fail_over(
) {
    let (_turn, s) = healed_turn().await;
    let master = s.named_master().await.expect("no master named");
    // What a sentinel is asked when another tries a failover: its vote, for
    // a leader that will never act, in an epoch above any used so far.
    for p in s.sentinel_ports() {
        let mut c = connect(&s.url(p, &s.sentinel_password)).await.unwrap();
        let _: redis::Value = redis::cmd("SENTINEL")
            .arg("is-master-down-by-addr")
            .arg("127.0.0.1")
            .arg(master)
            .arg(1_000_000)
            .arg("0123456789012345678901234567890123456789")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let healing = Instant::now();
    s.heal();
    let healed_in = healing.elapsed();
    s.kill_node(master);
    let killed = Instant::now();
    let new_master = s.wait_switch(master, Duration::from_secs(40)).await;
    let switched_in = killed.elapsed();
    eprintln!(
        "ready {healed_in:?} after the votes; :{master} killed, the sentinels named :{new_master} {switched_in:?} later"
    );
    assert!(
        switched_in < Duration::from_secs(10),
        "the sentinels failed over {switched_in:?} after the kill (the set was ready {healed_in:?} after the votes); events:\n{}",
        s.events()
    );
    s.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zadd_wakes_an_idle_business_within_100ms_also_after_a_failover() {
    let (_turn, s) = healed_turn().await;
    let f = flow(
        s,
        "wake",
        "scanners = 1\npoll_interval = \"30s\"\nwatchdog_interval = \"30s\"",
    )
    .await;
    let daemon = Daemon::start(&f.config);
    let on = |n: usize| {
        let log = daemon.logs();
        async move { log.matches("keyspace notifications on").count() >= n }
    };
    assert!(
        eventually(Duration::from_secs(15), || on(1)).await,
        "notifications never on:\n{}",
        daemon.logs()
    );
    // Let the scanner make its first claim and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Five ZADDs a round, each after the scanner went back to sleep: the
    // median says what a wake-up takes, not one scheduling hiccup of a
    // busy machine. Without a subscription it would take poll_interval (30 s).
    let probe = |round: &'static str| {
        let inbox = f.inbox.clone();
        let key = f.b.key.clone();
        async move {
            let mut c = s.master_conn().await;
            let mut took = Vec::new();
            for i in 0..5 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let body = format!("wake-{round}-{i}");
                let t0 = wall_ms();
                let _: i64 = redis::cmd("ZADD")
                    .arg(&key)
                    .arg(0)
                    .arg(&body)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                let arrived = eventually(Duration::from_secs(5), || {
                    let n = inbox.all().iter().any(|m| m.body == body.as_bytes());
                    async move { n }
                })
                .await;
                assert!(arrived, "{round}: {body} never arrived");
                let got = inbox
                    .all()
                    .into_iter()
                    .find(|m| m.body == body.as_bytes())
                    .unwrap();
                took.push(got.at_ms - t0);
            }
            eprintln!("{round}: woke after {took:?} ms");
            took.sort();
            took[2]
        }
    };
    let took = probe("before").await;
    assert!(
        took <= 100,
        "before the failover: woke after {took} ms (median)"
    );

    // The old master stays down: only a subscription on the new one can wake it.
    let victim = s.named_master().await.expect("no master named");
    s.kill_node(victim);
    let new_master = s.wait_switch(victim, Duration::from_secs(30)).await;
    let channel = format!("__keyspace@0__:{}", f.b.key);
    let subscribed = eventually(Duration::from_secs(15), || {
        let channel = channel.clone();
        async move {
            let Ok(mut c) = connect(&s.url(new_master, &s.password)).await else {
                return false;
            };
            let r: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            r.first().is_some_and(|(_, n)| *n >= 1)
        }
    })
    .await;
    assert!(
        subscribed,
        "delayd never subscribed on the new master :{new_master}; log:\n{}",
        daemon.logs()
    );
    // The new subscription wakes the scanner once, to catch up; let it sleep again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let took = probe("after").await;
    assert!(
        took <= 100,
        "after the failover: woke after {took} ms (median); log:\n{}",
        daemon.logs()
    );
    drop(daemon);
    let mut c = s.master_conn().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&f.b.key)
        .query_async(&mut c)
        .await
        .unwrap();
    s.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_master_name_check_exits_1_with_one_line_naming_the_field_and_run_keeps_retrying() {
    let _turn = SERIAL.lock().await;
    let s = shared();
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("lost");
    let amqp = amqp_at(&amqp_url()).await;
    declare_exchange(&amqp.create_channel().await.unwrap(), &b.exchange).await;
    let config = write_config_redis(dir.path(), &s.section("nosuch"), &amqp_url(), "off", &[&b]);
    let f = assert_check_fails(&config);
    assert!(
        f.line.contains("no master named \"nosuch\"") && f.line.contains("master_name"),
        "the line should name the master and the field: {}",
        f.line
    );

    // The daemon, like for any unreachable Redis, says why once and retries.
    let mut daemon = Daemon::start(&config);
    let said = eventually(Duration::from_secs(10), || {
        let n = daemon.logs().matches("master_name").count();
        async move { n >= 1 }
    })
    .await;
    assert!(said, "no line names master_name:\n{}", daemon.logs());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "delayd exited:\n{}",
        daemon.logs()
    );
    let log = daemon.logs();
    assert_eq!(log.matches("master_name").count(), 1, "{log}");
    assert!(!log.contains("panicked"), "{log}");
    daemon.signal(15); // SIGTERM
    let status = daemon.wait(Duration::from_secs(10));
    assert!(status.success(), "{status}:\n{}", daemon.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_passwords_work_and_no_password_reaches_logs_or_output() {
    let _turn = SERIAL.lock().await;
    let set = Private(Sentinels::start(
        Some(unique("masterpw")),
        Some(unique("sentinelpw")),
    ));
    let s = &set.0;
    let secrets = [
        s.password.clone().unwrap(),
        s.sentinel_password.clone().unwrap(),
    ];
    let leaks = |text: &str| secrets.iter().any(|p| text.contains(p.as_str()));
    let f = flow(s, "auth", "").await;
    // Every debug line too.
    let text = std::fs::read_to_string(&f.config)
        .unwrap()
        .replace("level = \"info\"", "level = \"debug\"");
    std::fs::write(&f.config, text).unwrap();
    let cfg = f.config.to_str().unwrap();

    let (code, out, err) = delayd(&["check", "--config", cfg]);
    assert_eq!(code, 0, "check failed:\n{out}\n{err}");
    assert!(!leaks(&out) && !leaks(&err), "a password in:\n{out}\n{err}");
    assert!(out.contains("keyspace notifications on"), "{out}");

    let mut c = s.master_conn().await;
    let now = redis_now_ms(&mut c).await;
    let want: Vec<String> = (0..300).map(|i| format!("a-{i}")).collect();
    let items: Vec<(f64, Vec<u8>)> = want
        .iter()
        .map(|m| (now as f64, m.clone().into_bytes()))
        .collect();
    zadd_many(&mut c, &f.b.key, &items).await;
    let daemon = Daemon::start(&f.config);
    f.wait_all(&want, Duration::from_secs(30), &daemon).await;
    f.assert_family_gone(s).await;
    let log = daemon.logs();
    assert!(
        log.contains("keyspace notifications on"),
        "no subscription through the master's password:\n{log}"
    );
    assert!(!leaks(&log), "a password in the log:\n{log}");
    drop(daemon);

    // Without the sentinels' password, or a wrong one: one line that says
    // which setting to change, and still no password.
    let original = std::fs::read_to_string(&f.config).unwrap();
    let sentinel_pw = format!("sentinel_password = \"{}\"\n", secrets[1]);
    for (what, replacement, expect) in [
        ("missing", String::new(), "set sentinel_password"),
        (
            "wrong",
            "sentinel_password = \"not-it\"\n".to_string(),
            "refused sentinel_password",
        ),
    ] {
        std::fs::write(&f.config, original.replace(&sentinel_pw, &replacement)).unwrap();
        let f = assert_check_fails(std::path::Path::new(cfg));
        assert!(f.line.contains(expect), "{what}: {}", f.line);
        assert!(
            !leaks(&f.out) && !leaks(&f.err),
            "{what}: a password in:\n{}\n{}",
            f.out,
            f.err
        );
    }
}

/// A data node stopped with SIGSTOP: it neither reads what the master sends
/// nor acknowledges it. Resumed (SIGCONT) when dropped, so a failing test
/// leaves the shared set usable.
struct Stalled(u32);

impl Stalled {
    fn node(s: &Sentinels, port: u16) -> Self {
        let pid: u32 = std::fs::read_to_string(s.dir.join(format!("{port}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        signal(pid, "-STOP");
        Stalled(pid)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid} failed");
}

/// The shared set as the nemesis's Redis (`common::nemesis`): the intake
/// waits for its one replica (`intake.replicas = 1`, the default in
/// sentinel mode), and the replica lags.
struct Lagging(&'static Sentinels);

/// What the nemesis does to the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SetFault {
    /// The replica stopped (SIGSTOP) for 1 to 4 s: intake writes reach the
    /// master, are not acknowledged, and are waited for again.
    ReplicaLag,
}

impl RedisSide for Lagging {
    type Fault = SetFault;

    fn section(&self) -> String {
        self.0.section("main")
    }

    async fn conn(&self) -> MultiplexedConnection {
        self.0.master_conn().await
    }

    async fn strike(&mut self, _: SetFault, rng: &mut rand::rngs::StdRng) {
        use rand::Rng;
        let (_, replica) = replica_port(self.0).await;
        let ms = rng.random_range(1000..4000);
        let stalled = Stalled::node(self.0, replica);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        drop(stalled);
    }
}

/// The standing nemesis of `tests/intake_nemesis.rs` over the set, with
/// three windows of a lagging replica among `kill -9` of an instance, a
/// RabbitMQ restart and a memory alarm: for a business without tenants and
/// for one with tenants (its publishes spread by `tenant_header`), both at
/// once on the one set, each with its own RabbitMQ node and instances (the
/// replica lags for both whenever either stops it). A master failover is not among
/// them: a claim or an ack the old master did not pass on costs a
/// duplicate no counter sees; `killing_the_master_mid_flow_...` and
/// `intake_messages_acknowledged_before_the_master_dies_...` cover it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_intake_publish_is_delivered_or_dead_under_a_nemesis_with_a_lagging_replica(
) {
    let (_turn, s) = healed_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let lag = Fault::Redis(SetFault::ReplicaLag);
    let faults = [
        lag,
        lag,
        lag,
        Fault::KillInstance,
        Fault::RabbitRestart,
        Fault::MemoryAlarm,
    ];
    let (plain, tenants) = (dir.path().join("plain"), dir.path().join("tenants"));
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::create_dir_all(&tenants).unwrap();
    tokio::join!(
        nemesis::run(
            "sentinel nemesis",
            Lagging(s),
            &plain,
            &faults,
            nemesis::Tenancy::None,
        ),
        nemesis::run(
            "sentinel tenants nemesis",
            Lagging(s),
            &tenants,
            &faults,
            nemesis::Tenancy::ByHeader,
        ),
    );
}

/// A business with an intake (default replica settings) in sentinel mode,
/// its daemon serving /metrics, and a producer channel in confirm mode.
struct IntakeFlow {
    _consumers: Consumers,
    b: BusinessSpec,
    exchange: String,
    queue: String,
    amqp: lapin::Connection,
    daemon: Daemon,
    metrics_port: u16,
}

/// A delay no test waits for: intake messages stay pending in `K`.
const HOUR_MS: i32 = 3_600_000;

impl IntakeFlow {
    async fn start(s: &Sentinels, name: &str) -> Self {
        Self::start_with(s, name, "").await
    }

    /// Like [`IntakeFlow::start`], with `intake` lines added to the intake's
    /// section.
    async fn start_with(s: &Sentinels, name: &str, intake: &str) -> Self {
        let mut b = BusinessSpec::random(name);
        let exchange = unique("intake-ex");
        let queue = unique("intake-q");
        b.extra = format!(
            "properties = \"standard\"\n[businesses.{name}.intake]\nexchange = \"{exchange}\"\nqueue = \"{queue}\"\n{intake}"
        );
        let c = Consumers::on(&amqp_url(), &[&b]).await;
        let config = write_config_redis(
            c.dir.path(),
            &s.section("main"),
            &amqp_url(),
            "127.0.0.1:0",
            &[&b],
        );
        let daemon = Daemon::start(&config);
        let amqp = amqp_at(&amqp_url()).await;
        wait_consumed_queue(&amqp, &queue, &daemon).await;
        let metrics_port = daemon.metrics_port().await;
        IntakeFlow {
            _consumers: c,
            b,
            exchange,
            queue,
            amqp,
            daemon,
            metrics_port,
        }
    }

    /// Publishes `ids` as message ids with an hour's `x-delay`, and waits
    /// for the broker's confirm of each.
    async fn publish(&self, ids: &[String]) {
        self.publish_in(ids, HOUR_MS).await
    }

    /// Publishes `ids` as message ids with `x-delay` = `delay_ms`, and
    /// waits for the broker's confirm of each.
    async fn publish_in(&self, ids: &[String], delay_ms: i32) {
        use lapin::options::ConfirmSelectOptions;
        let ch = self.amqp.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let mut confirms = Vec::new();
        for id in ids {
            let props = delayed(lapin::types::AMQPValue::LongInt(delay_ms))
                .with_message_id(id.as_str().into());
            let rk = &self.b.routing_key;
            confirms.push(publish_props(&ch, &self.exchange, rk, id.as_bytes(), props).await);
        }
        assert_acked(confirms, Duration::from_secs(10)).await;
    }

    /// Intake messages delayd acknowledged to the broker so far.
    async fn acked(&self) -> u64 {
        let series = format!("delayd_intake_stored_total{{business=\"{}\"}}", self.b.name);
        metric(self.metrics_port, &series).await.unwrap_or(0)
    }

    /// Waits until `n` intake messages are acknowledged; false after `limit`.
    async fn wait_acked(&self, n: u64, limit: Duration) -> bool {
        eventually(limit, || async { self.acked().await >= n }).await
    }

    /// Waits until `n` are acknowledged; panics after `limit`, saying when
    /// (`after`) and with the daemon's log.
    async fn assert_acked(&self, n: usize, limit: Duration, after: &str) {
        assert!(
            self.wait_acked(n as u64, limit).await,
            "only {} of {n} acknowledged {after}; log:\n{}",
            self.acked().await,
            self.daemon.logs()
        );
    }

    /// The ids of `ids` that are not pending in `K` on the master.
    async fn missing(&self, s: &Sentinels, ids: &[String]) -> Vec<String> {
        let mut c = s.master_conn().await;
        let pending: std::collections::HashSet<String> = redis::cmd("ZRANGE")
            .arg(&self.b.key)
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap();
        ids.iter()
            .filter(|id| !pending.contains(*id))
            .cloned()
            .collect()
    }

    async fn cleanup(self, s: &Sentinels) {
        drop(self.daemon);
        let ch = self.amqp.create_channel().await.unwrap();
        let _ = ch
            .queue_delete(self.queue.as_str().into(), Default::default())
            .await;
        let _ = ch
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await;
        let mut c = s.master_conn().await;
        for k in family(&self.b.key).all() {
            let _: i64 = redis::cmd("DEL")
                .arg(k)
                .query_async(&mut c)
                .await
                .unwrap_or(0);
        }
    }
}

/// The replica of the shared set: the data node the sentinels do not name.
async fn replica_port(s: &Sentinels) -> (u16, u16) {
    let master = s.named_master().await.expect("no master named");
    let replica = if master == s.base { s.base + 1 } else { s.base };
    (master, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_write_no_replica_holds_is_not_acknowledged_until_the_replica_takes_it() {
    let (_turn, s) = healed_turn().await;
    let f = IntakeFlow::start(s, "unreplicated").await;
    let (_, replica) = replica_port(s).await;
    let ids: Vec<String> = (0..200).map(|i| format!("u-{i}")).collect();
    let stalled = Stalled::node(s, replica);
    f.publish(&ids).await;
    // The first write after a start also finds the script missing, and each
    // of the batches in flight waits its replica_timeout (1 s) in turn.
    let said = eventually(Duration::from_secs(20), || async {
        f.daemon
            .logs()
            .contains("not acknowledged until enough replicas hold them")
            || f.acked().await > 0
    })
    .await;
    // Every write keeps failing for as long as the replica is stopped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acked = f.acked().await;
    let log = f.daemon.logs();
    drop(stalled);
    assert_eq!(
        acked, 0,
        "{acked} intake messages acknowledged while no replica could hold them; log:\n{log}"
    );
    assert!(
        said && log.contains("not acknowledged until enough replicas hold them"),
        "no line says why the intake waits:\n{log}"
    );
    assert_eq!(
        log.matches("not acknowledged until enough replicas")
            .count(),
        1,
        "one line per 10 s:\n{log}"
    );
    // The replica is back: the intake proceeds, and the replica has them all.
    f.assert_acked(
        ids.len(),
        Duration::from_secs(30),
        "after the replica came back",
    )
    .await;
    let missing = f.missing(s, &ids).await;
    assert!(
        missing.is_empty(),
        "{} not pending: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let mut r = connect(&s.url(replica, &s.password)).await.unwrap();
    let on_replica: u64 = redis::cmd("ZCARD")
        .arg(&f.b.key)
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(on_replica, ids.len() as u64, "the replica holds fewer");
    f.cleanup(s).await;
}

/// A write the master ran while its replica lagged is waited for again,
/// never run again: once its message is due, delivered and deleted, running
/// the write again would store it anew, one more delivery per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_message_due_at_once_is_delivered_once_while_the_replica_lags() {
    let (_turn, s) = healed_turn().await;
    let f = IntakeFlow::start(s, "lagging").await;
    let (_, replica) = replica_port(s).await;
    let ids: Vec<String> = (0..10).map(|i| format!("lag-{i}")).collect();
    let stalled = Stalled::node(s, replica);
    f.publish_in(&ids, 0).await;
    // The writes reach the master at once and their messages are due: the
    // scanners deliver them while the intake waits for the replica.
    tokio::time::sleep(Duration::from_secs(8)).await;
    drop(stalled);
    f.assert_acked(
        ids.len(),
        Duration::from_secs(30),
        "after the replica came back",
    )
    .await;
    let inbox = f._consumers.inbox();
    let want: std::collections::HashSet<Vec<u8>> =
        ids.iter().map(|i| i.as_bytes().to_vec()).collect();
    inbox.wait_for(ids.len(), Duration::from_secs(10)).await;
    inbox.settle(Duration::from_secs(2)).await;
    inbox.assert_each_once(&want, "a replica that lagged");
    f.cleanup(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intake_messages_acknowledged_before_the_master_dies_are_on_the_promoted_replica() {
    let (_turn, s) = healed_turn().await;
    let f = IntakeFlow::start(s, "failover").await;
    let (master, replica) = replica_port(s).await;
    let ids: Vec<String> = (0..200).map(|i| format!("f-{i}")).collect();
    // The replica stops reading, and the master drops its link: nothing
    // written from now on reaches the replica, not even its socket buffer.
    let stalled = Stalled::node(s, replica);
    let mut m = connect(&s.url(master, &s.password)).await.unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut m)
        .await
        .unwrap();
    f.publish(&ids).await;
    // Long enough for an intake that does not wait to acknowledge them all.
    f.wait_acked(ids.len() as u64, Duration::from_secs(5)).await;
    let acked_before = f.acked().await;

    // The master dies; the replica wakes and the sentinels promote it.
    s.kill_node(master);
    drop(stalled);
    let promoted = s.wait_switch(master, Duration::from_secs(30)).await;
    assert_eq!(promoted, replica, "the sentinels promoted another node");
    // The old master comes back as a replica, so writes can be replicated.
    s.heal();
    f.assert_acked(ids.len(), Duration::from_secs(60), "after the failover")
        .await;
    let missing = f.missing(s, &ids).await;
    // Every message is acknowledged now, so each must be pending.
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged intake messages are missing after the failover ({acked_before} were acknowledged while only the dead master held them; first: {:?})",
        missing.len(),
        ids.len(),
        &missing[..missing.len().min(5)]
    );
    f.cleanup(s).await;
}

/// Whether the server at `url` has `WAITAOF` (Redis 7.2 and later, Valkey).
async fn has_waitaof_at(url: &str) -> bool {
    has_waitaof(&mut connect(url).await.unwrap()).await
}

/// `CONFIG SET appendonly` on the node at `url`; waits until the append-only
/// file is on (its first rewrite done) or off.
async fn set_appendonly(url: &str, on: bool) {
    let mut c = connect(url).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg(if on { "yes" } else { "no" })
        .query_async(&mut c)
        .await
        .unwrap();
    let want = if on { "aof_enabled:1" } else { "aof_enabled:0" };
    let done = eventually(Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut c)
                .await
                .unwrap();
            info.contains(want)
                && info.contains("aof_rewrite_in_progress:0")
                && !info.contains("aof_rewrite_scheduled:1")
        }
    })
    .await;
    assert!(done, "{url}: appendonly {on} not in force within 20 s");
}

/// `replica_ack = "fsynced"` (WAITAOF): an intake write is acknowledged once
/// the replica has it in its append-only file, and not while the replica
/// keeps none (`appendonly no`: a replica without an append-only file
/// never reports an fsync, so it never counts), until it keeps one again.
/// `replica_timeout` is 3 s: on Redis 8.0.2 with the default 1 s no write
/// was ever acknowledged in 20 s (a replica fsyncs every second and reports
/// it on its own schedule); Valkey 8.1 acknowledged within 1 s.
/// Redis before 7.2 has no WAITAOF: there delayd refuses the setting at the
/// start (`fsynced_is_refused_with_one_line_where_redis_lacks_waitaof` in
/// `tests/intake.rs`), and this test has nothing to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsynced_intake_write_is_acknowledged_only_once_the_replicas_append_only_file_has_it() {
    let (_turn, s) = healed_turn().await;
    let (_, replica) = replica_port(s).await;
    let replica_url = s.url(replica, &s.password);
    if !has_waitaof_at(&replica_url).await {
        return;
    }
    set_appendonly(&replica_url, true).await;
    let f = IntakeFlow::start_with(s, "fsynced", "replica_ack = \"fsynced\"\n").await;
    let first: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    f.publish(&first).await;
    let acked = f.wait_acked(100, Duration::from_secs(20)).await;
    let mut rc = connect(&replica_url).await.unwrap();
    let rinfo: String = redis::cmd("INFO").query_async(&mut rc).await.unwrap();
    let mut mc = s.master_conn().await;
    let minfo: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut mc)
        .await
        .unwrap();
    assert!(
        acked,
        "only {} of 100 acknowledged with the replica's append-only file on; replica {replica}:\n{rinfo}\nmaster:\n{minfo}\nlog:\n{}",
        f.acked().await,
        f.daemon.logs()
    );

    set_appendonly(&replica_url, false).await;
    let second: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    f.publish(&second).await;
    // Each write waits its replica_timeout before it is refused and said so.
    let said = eventually(Duration::from_secs(15), || async {
        f.daemon
            .logs()
            .contains("fsynced it to their append-only file")
    })
    .await;
    let acked = f.acked().await;
    let log = f.daemon.logs();
    assert_eq!(
        acked,
        100,
        "{} acknowledged while the replica kept no append-only file; log:\n{log}",
        acked - 100
    );
    assert!(said, "no line says what the intake waits for:\n{log}");

    set_appendonly(&replica_url, true).await;
    let all = f.wait_acked(200, Duration::from_secs(30)).await;
    let got = f.acked().await;
    set_appendonly(&replica_url, false).await;
    assert!(
        all,
        "{got} of 200 acknowledged once the replica's append-only file was back"
    );
    let both: Vec<String> = first.into_iter().chain(second).collect();
    let missing = f.missing(s, &both).await;
    assert!(missing.is_empty(), "{} not pending", missing.len());
    f.cleanup(s).await;
}
