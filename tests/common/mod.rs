//! Test support: real Redis and RabbitMQ (from `DELAYD_TEST_REDIS_URL` and
//! `DELAYD_TEST_AMQP_URL`, which `deploy/local/test.sh` sets), random names per
//! test, the daemon as a child process, and a collecting consumer.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

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

/// A Redis connection to the shared server.
pub async fn redis() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .expect("Redis did not answer within 5s")
    .expect("cannot connect to Redis")
}

/// Redis's clock in epoch ms (the clock delayd's scripts use).
pub async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
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
    conn: &mut redis::aio::MultiplexedConnection,
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
pub async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
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

/// Like [`declare`], with queue arguments (e.g. `x-max-length`).
pub async fn declare_with(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    routing_key: &str,
    args: FieldTable,
) {
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Direct,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        routing_key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
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
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            unique("ctag").as_str().into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let inbox = Inbox::default();
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
        }
    });
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
    let mut s = format!(
        "[redis]\nurl = \"{redis_url}\"\n[amqp]\nurl = \"{amqp_url}\"\n[http]\nlisten = \"off\"\n[log]\nlevel = \"info\"\n"
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
        let child = Command::new(env!("CARGO_BIN_EXE_delayd"))
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
pub async fn wait_drained(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    limit: Duration,
) {
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

/// Asserts no key of the family is left behind (a clean drain leaves nothing).
pub async fn assert_family_empty(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    for k in family(key).all() {
        let exists: i64 = redis::cmd("EXISTS").arg(k).query_async(conn).await.unwrap();
        assert_eq!(exists, 0, "{k} still exists after the drain");
    }
}
