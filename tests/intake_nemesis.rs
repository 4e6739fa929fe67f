//! A standing nemesis on the intake road in (`common::nemesis`), over a
//! private Redis: `kill -9` of an instance, a Redis restart, a Redis
//! out-of-memory window, a RabbitMQ restart and a RabbitMQ memory alarm.
//! At the end every publish the broker confirmed is delivered (at least
//! once) or in the business's dead set with a reason, and the duplicates
//! are no more than delayd's counters of the events that may cost one.
//! It runs twice at once: for a business without tenants, and for one with
//! tenants named by the intake's header (none left in its index at the end).
//!
//! Private Redis and RabbitMQ (restarted by the test). The CI run makes
//! one pass over the faults (about a minute); `DELAYD_NEMESIS_SECS=600`
//! cycles them for that long; `DELAYD_NEMESIS_SEED` replays a run's order
//! and pauses (each run prints its seed). The same nemesis over a Sentinel
//! set, with a replica that lags, is in `tests/redis_sentinel.rs`.

use delayd_test_support as common;

use std::time::Duration;

use common::nemesis::{self, Fault, RedisSide, Tenancy};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use redis::aio::MultiplexedConnection;

/// A private Redis (AOF, fsynced on every write), restarted by the test.
struct Standalone(PrivateRedis);

/// What the nemesis does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RedisFault {
    /// Stopped (SIGTERM or SIGKILL) and started again on its data.
    Restart,
    /// At `maxmemory` under `noeviction`: every write refused with OOM,
    /// then room again.
    Oom,
}

impl RedisSide for Standalone {
    type Fault = RedisFault;

    fn section(&self) -> String {
        format!("[redis]\nurl = \"{}\"\n", self.0.url())
    }

    async fn conn(&self) -> MultiplexedConnection {
        self.0.conn().await
    }

    async fn strike(&mut self, fault: RedisFault, rng: &mut StdRng) {
        match fault {
            RedisFault::Restart => {
                let hard = rng.random_bool(0.5);
                tokio::task::block_in_place(|| {
                    if hard {
                        eprintln!("nemesis: Redis SIGKILLed");
                        self.0.signal("KILL");
                    }
                    self.0.stop();
                });
                let ms = rng.random_range(1000..3000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tokio::task::block_in_place(|| self.0.start());
            }
            RedisFault::Oom => {
                let mut c = self.0.conn().await;
                let refused = oom_errors(&mut c).await;
                config_set(&mut c, "maxmemory-policy", "noeviction").await;
                // Little room: writes are refused within a moment, and
                // again whenever deliveries have freed some. Deliveries
                // free memory too, and a reading can catch a passing reply
                // buffer of a claim's, so the room is measured again each
                // second until Redis has refused a write; the window lasts
                // until then, and then some.
                let mut full = false;
                for _ in 0..20 {
                    let used = info_field(&mut c, "memory", "used_memory:").await;
                    config_set(&mut c, "maxmemory", &(used + 16_000).to_string()).await;
                    full = eventually(Duration::from_secs(1), || {
                        let mut c = c.clone();
                        async move { oom_errors(&mut c).await > refused }
                    })
                    .await;
                    if full {
                        break;
                    }
                }
                assert!(full, "Redis refused no write with OOM within 20 s");
                let ms = rng.random_range(2000..4000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                config_set(&mut c, "maxmemory", "0").await;
            }
        }
    }
}

/// Commands Redis has refused with OOM since it started.
async fn oom_errors(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    info_field(c, "errorstats", "errorstat_OOM:count=").await
}

async fn config_set(c: &mut redis::aio::MultiplexedConnection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(c)
        .await
        .unwrap();
}

/// The nemesis over a private standalone Redis, for `tenancy`: the two
/// tests run at once, each with its own Redis, RabbitMQ node and instances.
async fn nemesis_over_standalone(what: &str, tenancy: Tenancy) {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = PrivateRedis::new(dir.path());
    tokio::task::block_in_place(|| redis.start());
    nemesis::run(
        what,
        Standalone(redis),
        dir.path(),
        &[
            Fault::KillInstance,
            Fault::Redis(RedisFault::Restart),
            Fault::Redis(RedisFault::Oom),
            Fault::RabbitRestart,
            Fault::MemoryAlarm,
        ],
        tenancy,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_intake_publish_is_delivered_or_dead_under_a_standing_nemesis() {
    nemesis_over_standalone("nemesis", Tenancy::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_intake_publish_to_a_business_with_tenants_is_delivered_or_dead_under_a_standing_nemesis(
) {
    nemesis_over_standalone("tenants nemesis", Tenancy::ByHeader).await;
}
