//! The intake's counters, registered with the process's other metrics.

use prometheus::{IntCounterVec, Registry};

/// Counters of what the intake took in, per business.
pub struct Metrics {
    /// Deliveries taken from the intake queue.
    pub received: IntCounterVec,
    /// Messages written to Redis and acknowledged.
    pub stored: IntCounterVec,
    /// Messages rejected (dead-lettered by the intake queue, or dropped if
    /// it has no dead-letter exchange), by reason.
    pub rejected: IntCounterVec,
    /// Messages whose `x-delay` is not a number: published at once.
    pub invalid_delay: IntCounterVec,
    /// Deliveries the broker marked redelivered: a crash or a lost channel
    /// came between an earlier write and its ack, so the message may be
    /// delivered twice (once only if it has a `message_id`).
    pub redelivered: IntCounterVec,
    /// Messages whose `user_id` named another user than delayd's: dropped,
    /// since the broker would refuse delayd's publish of it.
    pub user_id_dropped: IntCounterVec,
}

impl Metrics {
    /// The counters, registered in `r`.
    pub fn new(r: &Registry) -> Self {
        let b = &["business"];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(prometheus::Opts::new(name, help), labels)
                .expect("valid metric");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        Self {
            received: counter(
                "delayd_intake_received_total",
                "Deliveries taken from the intake queue",
                b,
            ),
            stored: counter(
                "delayd_intake_stored_total",
                "Intake messages written to Redis and acknowledged",
                b,
            ),
            rejected: counter(
                "delayd_intake_rejected_total",
                "Intake messages rejected to the intake queue's dead-lettering",
                &["business", "reason"],
            ),
            invalid_delay: counter(
                "delayd_intake_invalid_delay_total",
                "Intake messages whose x-delay is not a number, published at once",
                b,
            ),
            redelivered: counter(
                "delayd_intake_redelivered_total",
                "Intake deliveries marked redelivered (possible duplicates)",
                b,
            ),
            user_id_dropped: counter(
                "delayd_intake_user_id_dropped_total",
                "Intake messages whose user_id named another user than delayd's, dropped from the delivered message",
                b,
            ),
        }
    }
}
