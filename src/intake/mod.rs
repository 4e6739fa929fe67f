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

use lapin::message::BasicReturnMessage;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::config::intake_settings::Settings;
use crate::message::envelope::{self, Envelope};

use crate::amqp::Broker;
use crate::config::Business;
use crate::redis_conn::RedisConn;
use crate::store::Claimed;
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

/// The message to publish for a claimed member of an intake business: the
/// stored envelope, or `None` for a plain body (a task scheduled another
/// way, published as any id-mode task).
pub fn outgoing<'a>(business: &Business, claimed: &'a Claimed) -> Option<Envelope<'a>> {
    if !business.stores_envelopes() {
        return None;
    }
    envelope::decode(claimed.body())
}

/// Whether `ret` is the intake message `claimed` was published as: the same
/// body, routing key and `message_id`. `None` for a member that is not an
/// intake message.
pub fn returned_is(
    business: &Business,
    claimed: &Claimed,
    ret: &BasicReturnMessage,
) -> Option<bool> {
    // The body is the envelope's tail: most members fail this cheap test.
    if !claimed.body().ends_with(&ret.delivery.data) {
        return outgoing(business, claimed).map(|_| false);
    }
    let e = outgoing(business, claimed)?;
    Some(
        e.body == ret.delivery.data.as_slice()
            && e.routing_key == ret.delivery.routing_key.as_str()
            && e.properties.message_id() == ret.delivery.properties.message_id(),
    )
}
