//! The intake loop of one business: consume its intake queue, write each
//! batch of deliveries to Redis (one script call per shard), and only then
//! acknowledge them, with `multiple`.
//!
//! Acknowledging after the write is what makes the intake lose nothing: a
//! delivery that is not yet in Redis is unacknowledged, and the broker
//! hands it out again when delayd's channel or process goes away. The price
//! is a duplicate where a crash falls between a write and its ack; the
//! broker marks such a delivery redelivered, and delayd counts it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use tokio_util::sync::CancellationToken;

use crate::amqp::{unreadable, Broker};
use crate::config::Business;
use crate::redis_conn::RedisConn;
use crate::telemetry::{Backoff, Health, METRICS};

use super::{depth, topology};
use crate::config::intake_settings::Settings;
use crate::message::delay::{self, Due};
use crate::message::delivered;
use crate::message::envelope;
use crate::store::incoming::{self as write, Item, Writer};

/// Batches being written at once; with the prefetch, what keeps the broker
/// delivering while Redis writes.
const WRITES_IN_FLIGHT: usize = 4;

/// Opening the channel, declaring and subscribing take a few round trips;
/// on a connection that died as it was used, lapin may never answer.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// One business's intake.
pub struct Intake {
    business: Arc<Business>,
    settings: Settings,
    writer: Writer,
    redis: Arc<Health>,
    /// The user delayd publishes as, when known.
    own_user: Option<Arc<str>>,
    /// An unusable `x-delay` is logged at most once per [`LOG_EVERY`]; the
    /// counter says how many.
    invalid_logged: Throttle,
    /// The same for a dropped `user_id`.
    user_id_logged: Throttle,
    /// The same for Redis refusing the intake's writes.
    refused_logged: Throttle,
    /// The same for a delivery handed back [`HANDED_BACK_WARN`] times.
    handed_back_logged: Throttle,
    /// Where what cannot be stored goes, as verified on the current channel.
    dead_letters: std::sync::Mutex<topology::DeadLetters>,
}

/// The `x-delivery-count` from which a redelivery is worth a warning: half
/// of RabbitMQ 4's default delivery limit.
const HANDED_BACK_WARN: i64 = 10;

const LOG_EVERY: Duration = Duration::from_secs(10);

/// When a repeated warning was last logged.
#[derive(Default)]
struct Throttle(std::sync::Mutex<Option<Instant>>);

impl Throttle {
    /// True at most once per [`LOG_EVERY`].
    fn due(&self) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

/// Deliveries taken together, with what could be stored.
struct Batch {
    items: Vec<Item>,
    /// The delivery tag of each item.
    tags: Vec<u64>,
}

/// How a batch's write ended.
enum Written {
    /// Stored, every item of it; the items acknowledged already, by index
    /// (see [`Intake::ack_stored`]).
    Done(Batch, Vec<usize>),
    /// Not (all) stored when the stop came or the channel closed: left
    /// unacknowledged, so the broker hands the deliveries out again.
    Abandoned,
}

/// One batch counted in `delayd_intake_waiting_for_redis` from its first
/// refused write until it is written or given up (when dropped): several
/// batches are written at once, so the gauge counts them.
struct Waiting<'a> {
    business: &'a str,
    counted: std::cell::Cell<bool>,
}

impl<'a> Waiting<'a> {
    fn new(business: &'a str) -> Self {
        Self {
            business,
            counted: std::cell::Cell::new(false),
        }
    }

    fn begin(&self) {
        if !self.counted.replace(true) {
            METRICS
                .intake
                .waiting
                .with_label_values(&[self.business])
                .inc();
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.counted.get() {
            METRICS
                .intake
                .waiting
                .with_label_values(&[self.business])
                .dec();
        }
    }
}

/// Where a delivery goes when it cannot be stored to be published as it came.
enum Unstorable {
    /// It can: its envelope.
    No(Vec<u8>),
    /// Stored in the business's dead set, with this reason.
    ToDeadSet(Vec<u8>, String),
    /// Rejected to the dead-letter exchange (reason label, detail).
    ToDeadLetterExchange(&'static str, String),
}

/// Why a channel's consuming ended.
enum Ended {
    Stopped,
    Lost(String),
}

impl Intake {
    /// The intake of `business`, if it has one.
    pub fn new(
        business: Arc<Business>,
        conn: RedisConn,
        redis: Arc<Health>,
        own_user: Option<Arc<str>>,
    ) -> Option<Self> {
        let settings = business.intake.clone()?;
        Some(Self {
            writer: Writer::new(conn, &business),
            business,
            settings,
            redis,
            own_user,
            invalid_logged: Throttle::default(),
            user_id_logged: Throttle::default(),
            refused_logged: Throttle::default(),
            handed_back_logged: Throttle::default(),
            dead_letters: std::sync::Mutex::new(topology::DeadLetters::Kept(
                "not verified yet".into(),
            )),
        })
    }

    /// Consumes until `stop`, reconnecting with backoff; returns once what
    /// it took is written and acknowledged (or left to the broker).
    pub async fn run(self, broker: Broker, stop: CancellationToken) {
        let span = tracing::info_span!("intake", business = %self.business.name, queue = %self.settings.queue);
        tracing::Instrument::instrument(self.supervise(broker, stop), span).await
    }

    async fn supervise(self, broker: Broker, stop: CancellationToken) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut failing = false;
        loop {
            let Some(conn) = broker.ready(&stop).await else {
                return;
            };
            let opened = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout(OPEN_TIMEOUT, self.open(&conn)) => {
                    r.unwrap_or_else(|_| Err(format!("no answer within {OPEN_TIMEOUT:?}")))
                }
            };
            let reason = match opened {
                Ok((ch, consumer)) => {
                    tracing::info!(
                        exchange = %self.settings.exchange,
                        prefetch = self.settings.prefetch,
                        "consuming the intake queue"
                    );
                    failing = false;
                    backoff.reset();
                    let consuming =
                        depth::Consuming::start(&self.business.name, &ch, &self.settings.queue);
                    let ended = self.consume(&ch, consumer, &stop).await;
                    drop(consuming);
                    // Whatever was delivered and not acknowledged goes back
                    // to the queue with the channel.
                    let _ = ch.close(200, "delayd intake stopping".into()).await;
                    match ended {
                        Ended::Stopped => return,
                        Ended::Lost(reason) => reason,
                    }
                }
                Err(reason) => reason,
            };
            if !failing {
                tracing::warn!(%reason, "cannot consume the intake queue; retrying with backoff (its messages wait in the queue)");
                failing = true;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    async fn open(&self, conn: &Connection) -> Result<(Channel, Consumer), String> {
        let s = &self.settings;
        topology::ensure(conn, s).await.map_err(|e| {
            format!(
                "declaring exchange \"{}\" and queue \"{}\": {e}",
                s.exchange, s.queue
            )
        })?;
        let dead = topology::dead_letters(conn, s, true)
            .await
            .map_err(|e| format!("verifying the dead-letter target: {e}"))?;
        self.verified(dead);
        let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
        ch.basic_qos(s.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let tag = format!("delayd-intake-{:08x}", rand::random::<u32>());
        let consumer = ch
            .basic_consume(
                s.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("consuming queue \"{}\": {e}", s.queue))?;
        Ok((ch, consumer))
    }

    async fn consume(
        &self,
        ch: &Channel,
        mut consumer: Consumer,
        stop: &CancellationToken,
    ) -> Ended {
        let mut writes = FuturesOrdered::new();
        let mut reading = true;
        let mut lost = None;
        // Once a batch is left unwritten, a later `multiple` ack would cover
        // its deliveries too: from then on every ack names one delivery.
        let mut gap = false;
        loop {
            if !reading && writes.is_empty() {
                return match lost {
                    Some(reason) => Ended::Lost(reason),
                    None => Ended::Stopped,
                };
            }
            tokio::select! {
                biased;
                Some(written) = writes.next(), if !writes.is_empty() => {
                    if let Err(e) = self.settle(ch, written, &mut gap).await {
                        lost.get_or_insert(e);
                        reading = false;
                    }
                }
                _ = stop.cancelled(), if reading => {
                    reading = false;
                    let _ = ch.basic_cancel(consumer.tag(), BasicCancelOptions::default()).await;
                }
                next = consumer.next(), if reading && writes.len() < WRITES_IN_FLIGHT => {
                    let first = match next {
                        Some(Ok(d)) => d,
                        Some(Err(e)) => {
                            lost = Some(format!("the channel failed: {e}"));
                            reading = false;
                            continue;
                        }
                        None if !ch.status().connected() => {
                            lost = Some("the broker closed the channel".into());
                            reading = false;
                            continue;
                        }
                        None => {
                            lost = Some("the broker cancelled the consumer (queue deleted?)".into());
                            reading = false;
                            continue;
                        }
                    };
                    let mut deliveries = vec![first];
                    while deliveries.len() < self.settings.batch_size {
                        match consumer.next().now_or_never() {
                            Some(Some(Ok(d))) => deliveries.push(d),
                            _ => break,
                        }
                    }
                    match self.prepare(ch, deliveries).await {
                        Ok(batch) if batch.items.is_empty() => {}
                        Ok(batch) => writes.push_back(self.write(batch, ch.clone(), stop.clone())),
                        Err(e) => {
                            lost = Some(e);
                            reading = false;
                        }
                    }
                }
            }
        }
    }

    /// Reads each delivery's due time and id and encodes its envelope;
    /// rejects at once what cannot be stored.
    async fn prepare(&self, ch: &Channel, deliveries: Vec<Delivery>) -> Result<Batch, String> {
        let name = self.business.name.as_str();
        let m = &METRICS.intake;
        m.received
            .with_label_values(&[name])
            .inc_by(deliveries.len() as u64);
        let mut batch = Batch {
            items: Vec::with_capacity(deliveries.len()),
            tags: Vec::with_capacity(deliveries.len()),
        };
        for mut d in deliveries {
            if d.redelivered {
                m.redelivered.with_label_values(&[name]).inc();
                let count = delivered::drop_delivery_count(&mut d.properties);
                self.log_handed_back(count);
            }
            let due = delay::due_of(d.properties.headers().as_ref());
            if let Due::Invalid(what) = &due {
                m.invalid_delay.with_label_values(&[name]).inc();
                self.log_invalid(what);
            }
            let id = match d.properties.message_id() {
                Some(id) if !id.as_str().is_empty() => id.as_str().as_bytes().to_vec(),
                _ => {
                    let id = write::assign_id();
                    tracing::debug!(id = %String::from_utf8_lossy(&id), routing_key = %d.routing_key, "no message_id: assigned an id");
                    id
                }
            };
            let (props, dropped) = delivered::properties(
                &self.settings,
                self.own_user.as_deref(),
                &d.properties,
                &due,
            );
            if let Some(user) = dropped {
                m.user_id_dropped.with_label_values(&[name]).inc();
                self.log_user_id_dropped(user.as_str());
            }
            let (envelope, dead) = match self.unstorable(&d, &props) {
                Unstorable::No(env) => (env, None),
                Unstorable::ToDeadSet(env, reason) => (env, Some(reason)),
                Unstorable::ToDeadLetterExchange(reason, detail) => {
                    self.reject(ch, d.delivery_tag, reason, &detail).await?;
                    continue;
                }
            };
            let tenant = self
                .settings
                .tenant_header
                .as_deref()
                .and_then(|h| super::tenant::tenant_of(d.properties.headers().as_ref(), h));
            batch.items.push(Item {
                id,
                due,
                envelope,
                dead,
                tenant,
            });
            batch.tags.push(d.delivery_tag);
        }
        Ok(batch)
    }

    /// Whether a delivery can be stored to be published as it came, and
    /// where it goes when not: a message over `max_message_size` is
    /// rejected to the dead-letter exchange where that was verified on this
    /// channel (see [`topology::dead_letters`]), or else kept in the
    /// business's dead set with its reason; never dropped.
    fn unstorable(&self, d: &Delivery, props: &lapin::BasicProperties) -> Unstorable {
        if let Some(why) = unreadable::reason(&d.properties) {
            // Only the body is kept as it came; the broker's own copy,
            // byte for byte, goes to a dead-letter exchange when one is set.
            let bare = lapin::BasicProperties::default();
            let env = envelope::encode("", &bare, &d.data).unwrap_or_default();
            let detail = format!("lapin cannot read it: {why}");
            return self.dead_end(env, "unreadable", detail);
        }
        let env = match envelope::encode(d.routing_key.as_str(), props, &d.data) {
            Ok(env) => env,
            Err(e) => {
                let bare = lapin::BasicProperties::default();
                let env = envelope::encode("", &bare, &d.data).unwrap_or_default();
                return self.dead_end(
                    env,
                    "unencodable",
                    format!("its properties cannot be kept ({e})"),
                );
            }
        };
        match self.settings.max_message_size {
            Some(max) if env.len() > max => {
                let detail = format!(
                    "{} bytes stored, more than max_message_size = {max}",
                    env.len()
                );
                self.dead_end(env, "too large", detail)
            }
            _ => Unstorable::No(env),
        }
    }

    /// Keeps what [`topology::dead_letters`] found, saying so when it changed.
    fn verified(&self, dead: topology::DeadLetters) {
        let mut current = self.dead_letters.lock().unwrap_or_else(|p| p.into_inner());
        if *current == dead {
            return;
        }
        match &dead {
            topology::DeadLetters::Rejected => tracing::info!(
                dead_letter_exchange = self.settings.dead_letter_exchange.as_deref().unwrap_or_default(),
                dead_letter_queue = self.settings.dead_letter_queue.as_deref().unwrap_or_default(),
                "intake messages that cannot be stored are rejected to the dead-letter exchange (verified: the intake queue dead-letters to it, and the queue is bound behind it)"
            ),
            topology::DeadLetters::Kept(why) if self.settings.dead_letter_exchange.is_some() => {
                tracing::warn!(
                    reason = %why,
                    "intake messages that cannot be stored are kept in the business's dead set, not rejected to the dead-letter exchange: the broker would drop them"
                )
            }
            topology::DeadLetters::Kept(_) => {}
        }
        *current = dead;
    }

    fn dead_end(&self, env: Vec<u8>, reason: &'static str, detail: String) -> Unstorable {
        let rejected = *self.dead_letters.lock().unwrap_or_else(|p| p.into_inner())
            == topology::DeadLetters::Rejected;
        match rejected {
            true => Unstorable::ToDeadLetterExchange(reason, detail),
            false => {
                METRICS
                    .intake
                    .rejected
                    .with_label_values(&[&self.business.name, reason])
                    .inc();
                tracing::error!(reason, %detail, "intake message cannot be published as it came; kept in the business's dead set with its reason (see `delayd dead list`); only the body where its properties could not be read or kept");
                Unstorable::ToDeadSet(env, format!("intake: {reason}: {detail}"))
            }
        }
    }

    fn log_invalid(&self, what: &str) {
        if self.invalid_logged.due() {
            tracing::warn!(
                value = %what,
                "the delay header is not a number of milliseconds; published at once (the delayed-message plugin published a value of another type at once too, and closed the publisher's connection on a string that is not an integer; delayd_intake_invalid_delay_total counts them; one line per 10 s)"
            );
        }
    }

    /// Warns of a delivery the intake queue has handed out many times: a
    /// quorum queue that delayd did not declare keeps the broker's
    /// `delivery-limit` (20 on RabbitMQ 4) and drops the message past it.
    fn log_handed_back(&self, count: Option<i64>) {
        if count.is_some_and(|n| n >= HANDED_BACK_WARN) && self.handed_back_logged.due() {
            tracing::warn!(
                count,
                "an intake message has been handed back to the intake queue this many times (delayd stopped or lost its channel before Redis took it); a quorum queue drops it past its delivery-limit (20 by default on RabbitMQ 4) unless delayd declared the queue: for a queue declared otherwise, set a policy with delivery-limit 2147483647 (one line per 10 s)"
            );
        }
    }

    fn log_user_id_dropped(&self, user: &str) {
        if self.user_id_logged.due() {
            tracing::warn!(
                user_id = %user,
                delayd_user = self.own_user.as_deref().unwrap_or("(from its certificate)"),
                "user_id names another user than delayd's, and RabbitMQ would refuse delayd's publish of it: delivered without it (delayd_intake_user_id_dropped_total counts them; one line per 10 s). To keep it, give delayd's user the impersonator tag and set user_id = \"keep\""
            );
        }
    }

    async fn reject(
        &self,
        ch: &Channel,
        tag: u64,
        reason: &str,
        detail: &str,
    ) -> Result<(), String> {
        METRICS
            .intake
            .rejected
            .with_label_values(&[&self.business.name, reason])
            .inc();
        tracing::error!(
            reason,
            detail,
            dead_letter_exchange = self.settings.dead_letter_exchange.as_deref().unwrap_or_default(),
            "intake message cannot be stored; rejected (requeue = false) to the dead-letter exchange"
        );
        ch.basic_reject(tag, BasicRejectOptions { requeue: false })
            .await
            .map_err(|e| format!("rejecting a delivery: {e}"))
    }

    /// Writes a batch, retrying while Redis is away or refuses (out of
    /// memory, read-only, loading, a failover), until it is stored, the
    /// stop comes or the channel the deliveries came on closes. None of
    /// these is a reason to reject: until written, the deliveries stay
    /// unacknowledged in the broker, and reading stops once
    /// [`WRITES_IN_FLIGHT`] batches wait, so the queue holds the rest.
    /// Once the channel is gone the broker has requeued them, and writing
    /// them now would store them a second time.
    async fn write(&self, batch: Batch, ch: Channel, stop: CancellationToken) -> Written {
        let waiting = Waiting::new(&self.business.name);
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let (mut stored, mut acked) = (Vec::new(), Vec::new());
        for (shard, items) in self.writer.calls(&batch.items) {
            let call = rand::random::<u64>();
            loop {
                if !ch.status().connected() {
                    return Written::Abandoned;
                }
                let e = match self.writer.write(shard, &items, &batch.items, call).await {
                    Ok(counts) => {
                        self.redis.up();
                        self.stored(counts);
                        stored.extend_from_slice(&items);
                        break;
                    }
                    Err(e) => e,
                };
                waiting.begin();
                self.refused(&e);
                if self
                    .ack_stored(&ch, &batch, &stored, &mut acked)
                    .await
                    .is_err()
                {
                    return Written::Abandoned;
                }
                // Only between attempts: a call Redis may be running is
                // never given up half-way.
                tokio::select! {
                    _ = stop.cancelled() => return Written::Abandoned,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
        Written::Done(batch, acked)
    }

    /// Acknowledges, one by one, the items of a batch whose calls were
    /// stored while a later call of it waits: if that one is never stored
    /// (the stop, a closed channel, the consumer timeout), the broker hands
    /// back only what Redis does not hold, rather than the whole batch, of
    /// which the messages without a `message_id` would be stored twice.
    async fn ack_stored(
        &self,
        ch: &Channel,
        batch: &Batch,
        stored: &[usize],
        acked: &mut Vec<usize>,
    ) -> Result<(), lapin::Error> {
        let before = acked.len();
        for &i in &stored[before..] {
            ch.basic_ack(batch.tags[i], BasicAckOptions { multiple: false })
                .await?;
            acked.push(i);
        }
        METRICS
            .intake
            .stored
            .with_label_values(&[&self.business.name])
            .inc_by((acked.len() - before) as u64);
        Ok(())
    }

    /// Counts what a write absorbed and renamed.
    fn stored(&self, stored: write::Stored) {
        let name = self.business.name.as_str();
        let m = &METRICS.intake;
        m.absorbed
            .with_label_values(&[name])
            .inc_by(stored.absorbed);
        m.id_reused
            .with_label_values(&[name])
            .inc_by(stored.renamed);
    }

    /// Reports a write Redis refused, did not answer, or did not replicate
    /// in time: a metric at once, one log line per [`LOG_EVERY`].
    fn refused(&self, e: &write::WriteError) {
        let name = self.business.name.as_str();
        METRICS
            .intake
            .write_retries
            .with_label_values(&[name])
            .inc();
        let unreplicated = matches!(e, write::WriteError::Unreplicated { .. });
        match e {
            write::WriteError::Redis(e) if !e.is_wrong_type() => self.redis.down(e),
            _ => self.redis.up(),
        }
        if unreplicated {
            METRICS.intake.unreplicated.with_label_values(&[name]).inc();
        }
        if !self.refused_logged.due() {
            return;
        }
        if unreplicated {
            tracing::warn!(
                error = %e,
                "intake messages not acknowledged until enough replicas hold them: taking in paused, they wait in the intake queue unacknowledged, and the write is retried with backoff (delayd_intake_unreplicated_total, delayd_intake_waiting_for_redis; one line per 10 s). Check the replicas' link to the master (INFO replication); intake.replicas sets how many must hold a write"
            );
        } else {
            tracing::warn!(
                error = %e,
                "Redis does not store intake messages now; taking in paused, they wait in the intake queue unacknowledged, and the write is retried with backoff (delayd_intake_waiting_for_redis; one line per 10 s)"
            );
        }
    }

    /// Acknowledges what a write stored, with one `multiple` ack when
    /// nothing before it was left unwritten.
    async fn settle(&self, ch: &Channel, written: Written, gap: &mut bool) -> Result<(), String> {
        let Written::Done(batch, early) = written else {
            *gap = true;
            return Ok(());
        };
        // Acknowledged already: never again (an unknown tag closes the channel).
        let acked: Vec<u64> = match early.is_empty() {
            true => batch.tags,
            false => (0..batch.tags.len())
                .filter(|i| !early.contains(i))
                .map(|i| batch.tags[i])
                .collect(),
        };
        let Some(&last) = acked.last() else {
            return Ok(());
        };
        let ack = |tag, multiple| ch.basic_ack(tag, BasicAckOptions { multiple });
        if *gap || !early.is_empty() {
            for &tag in &acked {
                ack(tag, false)
                    .await
                    .map_err(|e| format!("acknowledging: {e}"))?;
            }
        } else {
            ack(last, true)
                .await
                .map_err(|e| format!("acknowledging: {e}"))?;
        }
        METRICS
            .intake
            .stored
            .with_label_values(&[&self.business.name])
            .inc_by(acked.len() as u64);
        Ok(())
    }
}
