//! Intake: a drop-in for the RabbitMQ delayed-message plugin.
//!
//! Producers keep publishing with `x-delay` to an exchange; delayd consumes
//! the queue bound to it, stores each message in the business's key family
//! (id mode: the id in `K` at its due time, the message in `{K}:body`), and
//! acknowledges it only then. When it comes due, the scanner publishes it
//! to the business's exchange with the producer's routing key, properties
//! and body, where RabbitMQ routes it as the plugin's `x-delayed-type` did.
//!
//! - [`delay`] (in `message`, shared with adoption): `x-delay`, `x-opt-delivery-delay` and `x-opt-delivery-time`, read as the plugin and AMQP 1.0 producers mean them;
//! - [`topology`]: the intake exchange and queue, declared when missing;
//! - `consumer`: consume, write in batches, then acknowledge;
//! - the Redis side is `store::incoming` (`src/lua/intake.lua`), shared with adoption;
//! - `tenant`: the tenant a message names in the business's `tenant_header`;
//! - `depth`: whether the queue is consumed, and how deep it is;
//! - [`waitaof`]: whether the server can wait as `replica_ack = "fsynced"` asks.

mod consumer;
mod depth;
mod tenant;
pub mod topology;
pub mod waitaof;

pub use crate::message::delay;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::amqp::Broker;
use crate::config::Business;
use crate::redis_conn::{Redis, RedisConn};
use crate::telemetry::Health;

/// Starts the intake of every business that has one; each task returns
/// after `stop`, once what it took in is written and acknowledged.
/// `own_user` is the user delayd publishes as, when known: a producer's
/// `user_id` naming it is kept. An intake that waits for replicas writes
/// over a connection of its own made from `settings` (`WAIT` blocks the
/// connection it runs on); the others share `conn`.
pub fn start(
    businesses: &[Arc<Business>],
    conn: &RedisConn,
    settings: &Redis,
    broker: &Broker,
    redis: &Arc<Health>,
    own_user: Option<Arc<str>>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    businesses
        .iter()
        .filter(|b| b.intake.is_some())
        .map(|b| {
            let (b, conn, settings) = (b.clone(), conn.clone(), settings.clone());
            let (broker, redis, own_user) = (broker.clone(), redis.clone(), own_user.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let waits = b
                    .intake
                    .as_ref()
                    .is_some_and(|i| i.replica_wait.replicas > 0);
                let conn = if waits {
                    match own_connection(&settings, &stop).await {
                        Some(c) => c,
                        None => return,
                    }
                } else {
                    conn
                };
                if let Some(intake) = consumer::Intake::new(b, conn, redis, own_user) {
                    intake.run(broker, stop).await;
                }
            })
        })
        .collect()
}

/// A connection for one intake's writes, retried with backoff until made
/// or `stop`.
async fn own_connection(settings: &Redis, stop: &CancellationToken) -> Option<RedisConn> {
    let mut backoff = crate::telemetry::Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(10),
    );
    loop {
        match settings.connect().await {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect to Redis for the intake's writes; retrying with backoff (its messages wait in the intake queue)")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}
