//! Test support: real Redis and RabbitMQ (from `DELAYD_TEST_REDIS_URL` and
//! `DELAYD_TEST_AMQP_URL`, which `deploy/local/test.sh` sets), random names per
//! test, the daemon as a child process, and a collecting consumer.
//!
//! - `servers`: free ports, private Redis and RabbitMQ servers, deploy scripts;
//! - `daemon`: the binary as a child process or a one-shot command, its HTTP;
//! - `http_api`: the console's JSON API and a daemon that serves it;
//! - `inbox`: exchanges, queues and the consumers that record deliveries;
//! - `raw_amqp`: a bare 0-9-1 client that publishes and reads property bytes as they are;
//! - `redis_keys`: Redis connections, bulk writes, key-family waits and checks;
//! - `relay`: a TCP relay to the broker that holds its replies (confirms) on demand;
//! - `config_file`: config files for the daemon under test;
//! - `setup`: the usual start of an end-to-end test;
//! - `nemesis`: the standing nemesis on the intake road, over a Redis a test supplies.

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

mod config_file;
mod daemon;
mod http_api;
mod inbox;
pub mod nemesis;
mod raw_amqp;
mod redis_keys;
mod relay;
mod servers;
mod setup;

/// The repository's root: this crate lives in its `tests/common`.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

// Each test binary uses a different part of this support.
#[allow(unused_imports)]
pub use config_file::*;
#[allow(unused_imports)]
pub use daemon::*;
#[allow(unused_imports)]
pub use http_api::*;
#[allow(unused_imports)]
pub use inbox::*;
#[allow(unused_imports)]
pub use raw_amqp::*;
#[allow(unused_imports)]
pub use redis_keys::*;
#[allow(unused_imports)]
pub use relay::*;
#[allow(unused_imports)]
pub use servers::*;
#[allow(unused_imports)]
pub use setup::*;

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

/// Fails listing every problem a check of files collected, one per line.
pub fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// A random suffix so concurrent tests never share keys, exchanges or queues.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// Local wall clock in epoch ms.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
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

/// Calls `f` every 50 ms until it returns a value; panics with `what`
/// after `limit`. For the blocking parts of a test.
pub fn poll_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
