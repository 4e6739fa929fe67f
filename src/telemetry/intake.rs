//! The intake's counters, registered with the process's other metrics.

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

/// Counters of what the intake took in, per business.
pub struct Metrics {
    /// Deliveries taken from the intake queue.
    pub received: IntCounterVec,
    /// Messages written to Redis and acknowledged.
    pub stored: IntCounterVec,
    /// Messages that cannot be published as they came (over
    /// `max_message_size`, unencodable), by reason: rejected to the
    /// dead-letter exchange, or kept in the business's dead set.
    pub rejected: IntCounterVec,
    /// Batches waiting while Redis refuses or does not answer the intake's
    /// writes: above 0, taking in is paused and messages wait in the queue.
    pub waiting: IntGaugeVec,
    /// Intake writes Redis refused or did not answer, each retried.
    pub write_retries: IntCounterVec,
    /// Intake writes the master stored but fewer replicas than
    /// `intake.replicas` held in time: not acknowledged, retried.
    pub unreplicated: IntCounterVec,
    /// Re-publishes (same id, same message) absorbed into the stored one.
    pub absorbed: IntCounterVec,
    /// Different messages published with an id already stored: kept too,
    /// under a derived id.
    pub id_reused: IntCounterVec,
    /// Messages whose delay header is not a number: published at once.
    pub invalid_delay: IntCounterVec,
    /// Deliveries the broker marked redelivered: a crash or a lost channel
    /// came between an earlier write and its ack, so the message may be
    /// delivered twice (once only if it has a `message_id`).
    pub redelivered: IntCounterVec,
    /// Messages whose `user_id` named another user than delayd's: dropped,
    /// since the broker would refuse delayd's publish of it.
    pub user_id_dropped: IntCounterVec,
    /// 1 while this instance consumes the intake queue, 0 while it cannot.
    pub consuming: IntGaugeVec,
    /// Messages ready in the intake queue (not yet delivered to a
    /// consumer), as the broker last said; sampled while consuming.
    pub queue_messages: IntGaugeVec,
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
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(prometheus::Opts::new(name, help), b).expect("valid metric");
            r.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        Self {
            consuming: gauge(
                "delayd_intake_consuming",
                "1 while this instance consumes the business's intake queue, 0 while it cannot (broker away, queue missing)",
            ),
            queue_messages: gauge(
                "delayd_intake_queue_messages",
                "Messages ready in the intake queue, as the broker said at the last sample (every 5 s while consuming)",
            ),
            waiting: gauge(
                "delayd_intake_waiting_for_redis",
                "Intake batches waiting while Redis refuses or does not answer their writes (above 0: taking in paused)",
            ),
            write_retries: counter(
                "delayd_intake_write_retries_total",
                "Intake writes Redis refused or did not answer, retried with backoff",
                b,
            ),
            unreplicated: counter(
                "delayd_intake_unreplicated_total",
                "Intake writes the master stored but fewer replicas than intake.replicas held within intake.replica_timeout: not acknowledged, retried",
                b,
            ),
            absorbed: counter(
                "delayd_intake_absorbed_total",
                "Intake messages identical to one already stored under their message_id, absorbed",
                b,
            ),
            id_reused: counter(
                "delayd_intake_id_reused_total",
                "Intake messages whose message_id names another stored message, kept under a derived id",
                b,
            ),
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
                "Intake messages that cannot be published as they came: rejected to the dead-letter exchange or kept in the dead set",
                &["business", "reason"],
            ),
            invalid_delay: counter(
                "delayd_intake_invalid_delay_total",
                "Intake messages whose delay header (x-delay, x-opt-delivery-delay or x-opt-delivery-time) is not a number, published at once",
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

    /// Zero series for an intake business (see
    /// [`super::Metrics::init_business`]): it is not consuming until its
    /// consumer says so, and has waited for nothing yet.
    pub fn init_business(&self, business: &str) {
        let b = &[business];
        for c in [
            &self.received,
            &self.stored,
            &self.write_retries,
            &self.unreplicated,
            &self.absorbed,
            &self.id_reused,
            &self.invalid_delay,
            &self.redelivered,
            &self.user_id_dropped,
        ] {
            c.with_label_values(b);
        }
        self.waiting.with_label_values(b).set(0);
        self.consuming.with_label_values(b).set(0);
    }
}
