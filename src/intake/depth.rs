//! What the console shows of an intake beside delivery: whether this
//! instance consumes its queue, and how many messages wait in it. The
//! depth is the broker's answer to a passive declare on the consuming
//! channel every [`EVERY`]: an AMQP round trip, no Redis command.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::Channel;

use crate::telemetry::METRICS;

/// How often the depth is sampled while consuming.
pub const EVERY: Duration = Duration::from_secs(5);

/// Marks the intake of `business` consuming until dropped, and samples its
/// queue's depth meanwhile.
pub struct Consuming {
    business: String,
    sampler: tokio::task::JoinHandle<()>,
}

impl Consuming {
    /// The intake of `business` consumes `queue` over `ch`.
    pub fn start(business: &str, ch: &Channel, queue: &str) -> Self {
        METRICS
            .intake
            .consuming
            .with_label_values(&[business])
            .set(1);
        Self {
            business: business.to_string(),
            sampler: tokio::spawn(sample(ch.clone(), queue.to_string(), business.to_string())),
        }
    }
}

impl Drop for Consuming {
    fn drop(&mut self) {
        self.sampler.abort();
        METRICS
            .intake
            .consuming
            .with_label_values(&[&self.business])
            .set(0);
    }
}

/// Sets `delayd_intake_queue_messages` every [`EVERY`] until the channel
/// stops answering (the consume loop notices and reopens).
async fn sample(ch: Channel, queue: String, business: String) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        let asked = ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        );
        match tokio::time::timeout(EVERY, asked).await {
            Ok(Ok(q)) => METRICS
                .intake
                .queue_messages
                .with_label_values(&[&business])
                .set(i64::from(q.message_count())),
            _ => return,
        }
    }
}
