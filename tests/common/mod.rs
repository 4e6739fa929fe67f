//! Test support: real Redis and RabbitMQ (from `DELAYD_TEST_REDIS_URL` and
//! `DELAYD_TEST_AMQP_URL`, which `deploy/local/test.sh` sets), random names per
//! test, the daemon as a child process, and a collecting consumer.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

/// Redis URL of the shared test server. A missing server is a failure.
pub fn redis_url() -> String {
    std::env::var("DELAYD_TEST_REDIS_URL")
        .expect("DELAYD_TEST_REDIS_URL is not set: run the suite with deploy/local/test.sh, which starts Redis and RabbitMQ")
}

/// AMQP URL of the shared test server. A missing server is a failure.
pub fn amqp_url() -> String {
    std::env::var("DELAYD_TEST_AMQP_URL")
        .expect("DELAYD_TEST_AMQP_URL is not set: run the suite with deploy/local/test.sh, which starts Redis and RabbitMQ")
}

/// A random suffix so concurrent tests never share keys, exchanges or queues.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// Connection settings that tolerate a busy CI machine: the client's default
/// half-second response timeout fails large pipelined ZADDs there.
pub fn slow_ok() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)))
}

/// A Redis connection to the shared server.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis_at(&redis_url()).await
}

/// A Redis connection to the server at `url`.
pub async fn redis_at(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection_with_config(&slow_ok()),
    )
    .await
    .expect("Redis did not answer within 5s")
    .expect("cannot connect to Redis")
}

/// Redis's clock in epoch ms (the clock delayd's scripts use).
pub async fn redis_now_ms(conn: &mut impl redis::aio::ConnectionLike) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// Local wall clock in epoch ms.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `ZADD key score member` for many members, pipelined.
pub async fn zadd_many(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    items: &[(f64, Vec<u8>)],
) {
    for chunk in items.chunks(1000) {
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(key);
        for (score, m) in chunk {
            cmd.arg(*score).arg(m.as_slice());
        }
        let _: i64 = cmd.query_async(conn).await.unwrap();
    }
}

/// `ZCARD` of a key.
pub async fn zcard(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// Every helper key of `key`, as delayd names them.
pub fn family(key: &str) -> delayd::store::KeyFamily {
    delayd::store::KeyFamily::new(key)
}

/// An AMQP connection to the shared (or a given) server.
pub async fn amqp_at(url: &str) -> Connection {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(url, ConnectionProperties::default()),
    )
    .await
    .expect("RabbitMQ did not answer within 10s")
    .expect("cannot connect to RabbitMQ")
}

/// Declares a durable direct exchange and a queue bound to it with `routing_key`.
pub async fn declare(ch: &Channel, exchange: &str, queue: &str, routing_key: &str) {
    declare_with(ch, exchange, queue, routing_key, FieldTable::default()).await
}

/// Declares a durable direct exchange, with no queue bound to it.
pub async fn declare_exchange(ch: &Channel, exchange: &str) {
    delayd::amqp::declare_exchange(ch, exchange).await.unwrap();
}

/// Like [`declare`], with queue arguments (e.g. `x-max-length`).
pub async fn declare_with(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    routing_key: &str,
    args: FieldTable,
) {
    delayd::amqp::declare_bound_queue(ch, exchange, queue, routing_key, args)
        .await
        .unwrap();
}

/// One received message.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Vec<u8>,
    pub at_ms: i64,
    pub headers: HashMap<String, AMQPValue>,
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
    pub content_type: Option<String>,
}

impl Received {
    /// `x-delayd-due`, epoch ms.
    pub fn due(&self) -> i64 {
        match self.headers.get("x-delayd-due") {
            Some(AMQPValue::LongLongInt(v)) => *v,
            other => panic!("x-delayd-due missing or odd: {other:?}"),
        }
    }
}

/// Messages collected by a background consumer.
#[derive(Clone, Default)]
pub struct Inbox(pub Arc<Mutex<Vec<Received>>>);

impl Inbox {
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn all(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
    /// The distinct bodies received so far.
    pub fn bodies(&self) -> HashSet<Vec<u8>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }
    /// Waits until at least `n` messages arrived; panics after `limit`.
    pub async fn wait_for(&self, n: usize, limit: Duration) {
        let start = Instant::now();
        while self.len() < n {
            if start.elapsed() > limit {
                panic!(
                    "only {} of {n} messages arrived within {limit:?}",
                    self.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    /// Waits until no message has arrived for `quiet`.
    pub async fn settle(&self, quiet: Duration) {
        let mut last = self.len();
        loop {
            tokio::time::sleep(quiet).await;
            let now = self.len();
            if now == last {
                return;
            }
            last = now;
        }
    }
}

/// Consumes `queue` in the background, recording every message's receipt time.
pub async fn consume(conn: &Connection, queue: &str) -> Inbox {
    let inbox = Inbox::default();
    consume_into(conn, queue, &inbox, false).await;
    inbox
}

/// A business section for a config file.
pub struct BusinessSpec {
    pub name: String,
    pub key: String,
    pub exchange: String,
    pub routing_key: String,
    pub extra: String,
}

impl BusinessSpec {
    /// A business with random key, exchange and routing key.
    pub fn random(name: &str) -> Self {
        Self {
            name: name.to_string(),
            key: unique(&format!("test:{name}")),
            exchange: unique("ex"),
            routing_key: unique("rk"),
            extra: String::new(),
        }
    }
}

/// Writes a config file for the given servers and businesses.
pub fn write_config(
    dir: &Path,
    redis_url: &str,
    amqp_url: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_with(
        dir,
        redis_url,
        &format!("url = \"{amqp_url}\""),
        "off",
        businesses,
    )
}

/// Like [`write_config`], with the body of `[amqp]` as given (node list,
/// TLS files) and `[http] listen`.
pub fn write_config_with(
    dir: &Path,
    redis_url: &str,
    amqp_section: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_full(
        dir,
        &format!("[redis]\nurl = \"{redis_url}\"\n"),
        amqp_section,
        http_listen,
        businesses,
    )
}

/// Like [`write_config`], with a whole `[redis]` section (cluster,
/// sentinel, TLS) and `[http] listen`.
pub fn write_config_redis(
    dir: &Path,
    redis_section: &str,
    amqp_url: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_full(
        dir,
        redis_section,
        &format!("url = \"{amqp_url}\""),
        http_listen,
        businesses,
    )
}

fn write_config_full(
    dir: &Path,
    redis_section: &str,
    amqp_section: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    let mut s = format!(
        "{redis_section}[amqp]\n{amqp_section}\n[http]\nlisten = \"{http_listen}\"\n[log]\nlevel = \"info\"\n"
    );
    for b in businesses {
        s.push_str(&format!(
            "[businesses.{}]\nkey = \"{}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\n{}\n",
            b.name, b.key, b.exchange, b.routing_key, b.extra
        ));
    }
    let path = dir.join(format!("{}.toml", unique("delayd")));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(s.as_bytes())
        .unwrap();
    path
}

/// The binary the daemon tests run: this build's, or `DELAYD_TEST_BIN` (to
/// show that a test fails against an older build).
pub fn daemon_bin() -> PathBuf {
    std::env::var_os("DELAYD_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_delayd")))
}

/// The daemon as a child process, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `delayd run --config path`, logging to a file beside the config.
    pub fn start(config: &Path) -> Self {
        let log = config.with_extension(format!("{}.log", rand::random::<u32>()));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(daemon_bin())
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("cannot start delayd");
        Self { child, log }
    }

    /// Sends a signal (e.g. `libc::SIGTERM`) to the daemon.
    pub fn signal(&self, sig: i32) {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits for exit; panics after `limit`.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "delayd did not exit within {limit:?}; log:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the daemon wrote to stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 40 lines of the daemon's log, for failure messages.
    pub fn tail(&self) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with arguments and returns (exit code, stdout, stderr).
pub fn delayd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_delayd"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run delayd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until `key` and its in-flight set are both empty; panics after `limit`.
pub async fn wait_drained(conn: &mut impl redis::aio::ConnectionLike, key: &str, limit: Duration) {
    let f = family(key);
    let start = Instant::now();
    loop {
        let p = zcard(conn, &f.pending).await;
        let i = zcard(conn, &f.inflight).await;
        if p == 0 && i == 0 {
            return;
        }
        if start.elapsed() > limit {
            panic!("{key} not drained within {limit:?}: {p} pending, {i} in flight");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no key of the family is left, for tests that kill or cut off
/// the daemon: what a crash leaves (a claim record, retry state) is recovered
/// or swept within a lease plus a sweep interval. Panics after `limit`.
pub async fn wait_family_empty(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    limit: Duration,
) {
    let start = Instant::now();
    loop {
        let mut left = Vec::new();
        for k in family(key).all() {
            let exists: i64 = redis::cmd("EXISTS").arg(k).query_async(conn).await.unwrap();
            if exists == 1 {
                left.push(k.to_string());
            }
        }
        if left.is_empty() {
            return;
        }
        if start.elapsed() > limit {
            panic!("{left:?} still exist {limit:?} after the drain");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes `keys` (one key or several).
pub async fn del(conn: &mut impl redis::aio::ConnectionLike, keys: impl redis::ToRedisArgs) {
    let _: i64 = redis::cmd("DEL").arg(keys).query_async(conn).await.unwrap();
}

/// Deletes every key of the family (for tests that leave members behind).
pub async fn del_family(conn: &mut impl redis::aio::ConnectionLike, key: &str) {
    del(conn, &family(key).all()[..]).await;
}

/// How many keys of the family exist.
pub async fn family_keys_left(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> i64 {
    redis::cmd("EXISTS")
        .arg(&family(key).all()[..])
        .query_async(conn)
        .await
        .unwrap()
}

/// Asserts no key of the family is left behind (a clean drain leaves nothing).
pub async fn assert_family_empty(conn: &mut impl redis::aio::ConnectionLike, key: &str) {
    for k in family(key).all() {
        let exists: i64 = redis::cmd("EXISTS").arg(k).query_async(conn).await.unwrap();
        assert_eq!(exists, 0, "{k} still exists after the drain");
    }
}

/// Like [`consume`], but into an existing inbox and, with `ack`, acknowledging
/// each message only after it is recorded: a message the consumer never saw is
/// requeued by the broker instead of lost when the connection drops.
pub async fn consume_into(conn: &Connection, queue: &str, inbox: &Inbox, ack: bool) {
    let ch = conn.create_channel().await.unwrap();
    if ack {
        ch.basic_qos(500, BasicQosOptions::default()).await.unwrap();
    }
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            unique("ctag").as_str().into(),
            BasicConsumeOptions {
                no_ack: !ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let out = inbox.clone();
    tokio::spawn(async move {
        let _keep = ch;
        while let Some(Ok(d)) = consumer.next().await {
            let headers = d
                .properties
                .headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            out.0.lock().unwrap().push(Received {
                body: d.data.clone(),
                at_ms: wall_ms(),
                headers,
                message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                delivery_mode: *d.properties.delivery_mode(),
                content_type: d.properties.content_type().as_ref().map(|s| s.to_string()),
            });
            if ack && d.ack(BasicAckOptions::default()).await.is_err() {
                break;
            }
        }
    });
}

/// Messages waiting in `queue` (a passive declare: the queue must exist).
pub async fn queue_depth(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.unwrap();
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = ch.close(200, "ok".into()).await;
    q.message_count()
}

/// Ports handed out in this process, so two tests never pick the same one
/// before either server has bound it.
static TAKEN_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A random port in `range` on which nothing listens, nor on `port + offset`
/// for each of `also` (RabbitMQ's Erlang distribution port, for one).
pub fn free_port(range: std::ops::Range<u16>, also: &[u16]) -> u16 {
    let mut taken = TAKEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let p = rand::random_range(range.clone());
        let all: Vec<u16> = std::iter::once(p)
            .chain(also.iter().map(|o| p + o))
            .collect();
        if all.iter().any(|q| taken.contains(q)) {
            continue;
        }
        if all.iter().all(|q| port_free(*q)) {
            taken.extend(all);
            return p;
        }
    }
    panic!("no free port in {range:?}");
}

/// Polls `check` every 50 ms until it returns true; false after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A private `redis-server` (AOF on, fsync on every write) on its own port
/// and directory, for tests that stop and restart Redis. Killed when dropped.
pub struct PrivateRedis {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Picks a free port; the server is not started yet.
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join(format!("redis-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port: free_port(10000..20000, &[]),
            dir,
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server on its port and directory (keeping any data there)
    /// and waits until it answers PING; panics after 20 s.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "private Redis already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--notify-keyspace-events",
                "Kz",
                "--daemonize",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cannot start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while !self.answers() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "private Redis on port {} did not answer within 20s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True when the server answers PING with PONG (not LOADING).
    pub fn answers(&self) -> bool {
        use std::io::Read;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    /// SIGTERM (Redis flushes its AOF and exits) and waits; panics after 20 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("private Redis on port {} ignored SIGTERM", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection to this server.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis_at(&self.url()).await
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A private RabbitMQ node run by `deploy/local/rabbitmq-node.sh`
/// (`DELAYD_TEST_RABBITMQ_NODE_SCRIPT`), its state in its own directory, so
/// a test can stop and restart the broker. Killed when dropped.
pub struct PrivateRabbit {
    pub port: u16,
    pub dir: PathBuf,
    running: bool,
}

impl PrivateRabbit {
    /// Picks a free AMQP port (and its distribution port, +10000); not started.
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join(format!("rabbit-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port: free_port(20000..30000, &[10000]),
            dir,
            running: false,
        }
    }

    /// Writes `advanced.config` (Erlang terms) before the first start, e.g.
    /// `[{rabbit, [{max_message_size, 1048576}]}].`
    pub fn advanced_config(&self, terms: &str) {
        std::fs::write(self.dir.join("advanced.config"), terms).unwrap();
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn script() -> PathBuf {
        std::env::var_os("DELAYD_TEST_RABBITMQ_NODE_SCRIPT")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/rabbitmq-node.sh")
            })
    }

    async fn run(&self, cmd: &str, limit: Duration) {
        let out = tokio::time::timeout(
            limit,
            tokio::process::Command::new(Self::script())
                .arg(cmd)
                .arg(&self.dir)
                .arg(self.port.to_string())
                .env("DELAYD_START_TIMEOUT", limit.as_secs().to_string())
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("rabbitmq-node.sh {cmd} took longer than {limit:?}"))
        .expect("cannot run rabbitmq-node.sh");
        assert!(
            out.status.success(),
            "rabbitmq-node.sh {cmd} {} {} failed: {}",
            self.dir.display(),
            self.port,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the node (or restarts it on the same directory) and waits
    /// until it has fully booted.
    pub async fn start(&mut self) {
        self.running = true;
        self.run("start", Duration::from_secs(90)).await;
    }

    /// Runs `rabbitmqctl ARGS` against the node; panics if it fails.
    pub async fn ctl(&self, args: &[&str]) {
        let out = tokio::process::Command::new(Self::script())
            .arg("ctl")
            .arg(&self.dir)
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("cannot run rabbitmq-node.sh");
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Graceful stop; returns once the AMQP port is closed.
    pub async fn stop(&mut self) {
        self.run("stop", Duration::from_secs(90)).await;
        self.running = false;
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if self.running {
            let _ = Command::new(Self::script())
                .arg("kill")
                .arg(&self.dir)
                .arg(self.port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Runs `deploy/local/NAME ARGS` with extra environment; its stdout, or a
/// panic with its stderr. The scripts bound their own waits.
pub fn run_script(name: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/local")
        .join(name);
    let out = Command::new(&path)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{name} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Test certificates from `deploy/local/certs.sh`, made once per test binary.
pub fn certs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("delayd-certs-{}", std::process::id()));
        run_script("certs.sh", &[dir.to_str().unwrap()], &[]);
        dir
    })
}

/// An AMQP port in 46000..49000 whose distribution port (AMQP - 10000) is
/// free too: the range private RabbitMQ nodes of the TLS and cluster tests use.
pub fn rabbit_port() -> u16 {
    free_port(36000..39000, &[10000]) + 10000
}

/// `GET path` on 127.0.0.1:port: (status code, body); `None` if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// Ends `pids` (servers a test started once for its whole binary, which no
/// destructor stops) when this test process exits, however it exits.
pub fn reap_with_this_process(pids: &[u32]) {
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let _ = Command::new("setsid")
        .args([
            "bash",
            "-c",
            "while kill -0 \"$1\" 2>/dev/null; do sleep 0.5; done; shift; kill -KILL \"$@\" 2>/dev/null",
            "_",
            &std::process::id().to_string(),
        ])
        .args(&list)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A script under `deploy/local/`.
pub fn deploy_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/local")
        .join(name)
}

/// Extracts the members of every message, sorted, and the count of each.
pub fn counts(inbox: &Inbox) -> HashMap<Vec<u8>, usize> {
    let mut m = HashMap::new();
    for r in inbox.all() {
        *m.entry(r.body).or_insert(0) += 1;
    }
    m
}

/// Waits until every body in `want` has arrived at least once; panics after
/// `limit` with the count missing and the tail of the daemon's log.
pub async fn wait_all(inbox: &Inbox, want: &HashSet<Vec<u8>>, limit: Duration, d: &Daemon) {
    let start = Instant::now();
    loop {
        let got = inbox.bodies();
        if want.is_subset(&got) {
            return;
        }
        if start.elapsed() > limit {
            panic!(
                "{} of {} members not delivered within {limit:?}; daemon log:\n{}",
                want.difference(&got).count(),
                want.len(),
                d.tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Declares `queue` bound to the business's exchange and consumes it.
pub async fn bind_and_consume(
    conn: &Connection,
    ch: &Channel,
    b: &BusinessSpec,
    queue: &str,
) -> Inbox {
    declare(ch, &b.exchange, queue, &b.routing_key).await;
    consume(conn, queue).await
}

/// The usual start of an end-to-end test: on the given broker, a consumed
/// queue bound to each business's exchange; a config for the businesses in
/// a temporary directory; a Redis connection. The daemon is the test's to
/// start. Keep the whole value alive: the directory and the consumers go
/// with it.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub redis: redis::aio::MultiplexedConnection,
    pub amqp: Connection,
    pub ch: Channel,
    /// One queue and inbox per business, in order.
    pub queues: Vec<String>,
    pub inboxes: Vec<Inbox>,
}

impl Setup {
    /// Against the shared Redis and RabbitMQ.
    pub async fn new(businesses: &[&BusinessSpec]) -> Self {
        Self::on(&redis_url(), &amqp_url(), businesses).await
    }

    /// Against the servers at `redis_url` and `amqp_url`.
    pub async fn on(redis_url: &str, amqp_url: &str, businesses: &[&BusinessSpec]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let amqp = amqp_at(amqp_url).await;
        let ch = amqp.create_channel().await.unwrap();
        let (mut queues, mut inboxes) = (Vec::new(), Vec::new());
        for b in businesses {
            let queue = unique("q");
            inboxes.push(bind_and_consume(&amqp, &ch, b, &queue).await);
            queues.push(queue);
        }
        let config = write_config(dir.path(), redis_url, amqp_url, businesses);
        Setup {
            dir,
            config,
            redis: redis_at(redis_url).await,
            amqp,
            ch,
            queues,
            inboxes,
        }
    }

    /// The first business's inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inboxes[0]
    }
}
