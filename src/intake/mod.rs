//! Intake: a drop-in for the RabbitMQ delayed-message plugin.
//!
//! Producers keep publishing with `x-delay` to an exchange; delayd consumes
//! the queue bound to it, stores each message in the business's key family
//! (id mode: the id in `K` at its due time, the message in `{K}:body`), and
//! acknowledges it only then. When it comes due, the scanner publishes it
//! to the business's exchange with the producer's routing key, properties
//! and body, where RabbitMQ routes it as the plugin's `x-delayed-type` did.
//!
//! - [`delay`]: `x-delay`, `x-opt-delivery-delay` and `x-opt-delivery-time`, read as the plugin and AMQP 1.0 producers mean them;
//! - [`topology`]: the intake exchange and queue, declared when missing;
//! - `consumer`: consume, write in batches, then acknowledge;
//! - `write`: the Redis side (`src/lua/intake.lua`).

mod consumer;
pub mod delay;
mod delivered;
pub mod topology;
mod write;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::amqp::Broker;
use crate::config::Business;
use crate::redis_conn::RedisConn;
use crate::telemetry::Health;

/// Starts the intake of every business that has one; each task returns
/// after `stop`, once what it took in is written and acknowledged.
/// `own_user` is the user delayd publishes as, when known: a producer's
/// `user_id` naming it is kept.
pub fn start(
    businesses: &[Arc<Business>],
    conn: &RedisConn,
    broker: &Broker,
    redis: &Arc<Health>,
    own_user: Option<Arc<str>>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    businesses
        .iter()
        .filter_map(|b| {
            consumer::Intake::new(b.clone(), conn.clone(), redis.clone(), own_user.clone())
        })
        .map(|intake| tokio::spawn(intake.run(broker.clone(), stop.clone())))
        .collect()
}
