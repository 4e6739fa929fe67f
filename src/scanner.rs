//! One scanner: claim due members, publish them, and (in its settler task)
//! settle each one by the broker's answer.
//!
//! The scanner is only ever cancelled at safe points: before a claim and
//! while it sleeps. Once a claim has run, every member it returned is handed
//! to the settler, which answers for it: acked, retried, dead-lettered or
//! released back to pending. Nothing claimed is forgotten.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::{Channel, Confirmation};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::amqp::{self, Broker};
use crate::config::Business;
use crate::store::{Claimed, Store};
use crate::telemetry::{Backoff, Health, METRICS};

/// Publishes-per-second limiter shared by every scanner of a business.
pub type RateLimiter = governor::DefaultDirectRateLimiter;

/// One Redis key of a business and what its scanners share.
pub struct Lane {
    /// The business this key belongs to.
    pub business: Arc<Business>,
    /// Script calls for this key's family.
    pub store: Store,
    /// Wakes the lead scanner early: a keyspace notification, or a scanner
    /// that saw more work than it could take. Stores a permit, so a wake-up
    /// that arrives while the leader is busy is not lost.
    pub lead_wake: Notify,
    /// Wakes the other scanners when the leader found a full batch.
    pub all_wake: Notify,
    /// True while keyspace notifications for this key are being received.
    pub notifications: AtomicBool,
    /// Shared publish-rate cap of the business and its burst, when configured.
    pub limiter: Option<(Arc<RateLimiter>, usize)>,
    /// Redis reachability, shared by the process.
    pub redis: Arc<Health>,
    /// Claims the leader has made: the others check that it still moves.
    pub lead_claims: AtomicU64,
}

impl Lane {
    fn max_idle(&self) -> Duration {
        if self.notifications.load(Ordering::Relaxed) {
            self.business.watchdog_interval
        } else {
            self.business.poll_interval
        }
    }
}

/// A published member waiting for its confirm.
struct Outstanding {
    member: Vec<u8>,
    due_ms: i64,
    attempt: u32,
    /// The record of the claim this member came from, if it has one.
    record: Option<Arc<str>>,
    /// Redis's clock at claim time, plus `claimed_at.elapsed()`, gives a
    /// wall time on Redis's clock without asking it again.
    claim_now_ms: i64,
    claimed_at: Instant,
}

/// Handed from the scanner to its settler.
enum ToSettle {
    /// A claim wrote a record of due times for this many members; sent
    /// before any of them, so the settler can forget it once all are settled.
    Claimed(Arc<str>, usize),
    Published(Outstanding, lapin::PublisherConfirm),
    /// Claimed but never published (the channel broke mid-batch).
    Unpublished(Vec<Claimed>, Option<Arc<str>>),
}

/// Runs scanner `index` of `lane` until `stop` is cancelled, then waits for
/// its settler, which finishes by `drain_deadline` at the latest.
pub async fn run(
    lane: Arc<Lane>,
    index: usize,
    broker: Broker,
    stop: CancellationToken,
    drain_deadline: Arc<tokio::sync::OnceCell<tokio::time::Instant>>,
) {
    let span = tracing::info_span!("scanner", business = %lane.business.name, key = %lane.store.keys().pending, index);
    async move {
        let window = Arc::new(Semaphore::new(lane.business.window));
        let (tx, rx) = mpsc::unbounded_channel();
        let settler = tokio::spawn(
            settle(lane.clone(), rx, window.clone(), drain_deadline).in_current_span(),
        );
        // The channel outlives the settler: dropping it closes it, and a
        // closed channel fails the confirms still owed, which would hand
        // back members the broker already has.
        let channel = scan(&lane, index, &broker, &stop, &window, &tx).await;
        drop(tx);
        if let Err(e) = settler.await {
            tracing::error!(error = %e, "settler task failed; its leases will be recovered");
        }
        drop(channel);
    }
    .instrument(span)
    .await
}

async fn scan(
    lane: &Lane,
    index: usize,
    broker: &Broker,
    stop: &CancellationToken,
    window: &Arc<Semaphore>,
    tx: &mpsc::UnboundedSender<ToSettle>,
) -> Option<Channel> {
    let b = &lane.business;
    let mut channel: Option<Channel> = None;
    let mut redis_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut amqp_backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut channel_error_logged = false;
    let mut wrong_type_logged = false;
    let sleep_or_stop = |d: Duration| async move {
        tokio::select! {
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    };

    while !stop.is_cancelled() {
        if broker.is_blocked() && broker.ready(stop).await.is_none() {
            break;
        }
        if channel.as_ref().is_none_or(|c| !c.status().connected()) {
            channel = None;
            match broker.channel(stop).await {
                None => break,
                Some(Ok(c)) => {
                    if channel_error_logged {
                        tracing::info!("channel open again; publishing resumes");
                    }
                    channel_error_logged = false;
                    amqp_backoff.reset();
                    channel = Some(c);
                }
                Some(Err(e)) => {
                    if !channel_error_logged && broker.health.is_up() {
                        tracing::warn!(error = %e, "cannot open a channel; retrying");
                        channel_error_logged = true;
                    }
                    if !sleep_or_stop(amqp_backoff.next_delay()).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let Some(ch) = channel.clone() else { continue };

        // Take as many window slots as are free, up to a batch, waiting for one.
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            p = window.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        first.forget();
        let mut want = 1usize;
        while want < b.batch_size {
            match window.try_acquire() {
                Ok(p) => {
                    p.forget();
                    want += 1;
                }
                Err(_) => break,
            }
        }
        if let Some((limiter, max_burst)) = &lane.limiter {
            // The limiter refuses a request larger than its burst: ask for
            // no more than it can ever grant, and give the rest back.
            if want > *max_burst {
                window.add_permits(want - *max_burst);
                want = *max_burst;
            }
            let burst = NonZeroU32::new(want as u32).unwrap_or(NonZeroU32::MIN);
            let ok = tokio::select! {
                _ = stop.cancelled() => false,
                r = limiter.until_n_ready(burst) => r.is_ok(),
            };
            if !ok {
                window.add_permits(want);
                if stop.is_cancelled() {
                    break;
                }
                continue;
            }
        }

        // From here on, no cancellation until every claimed member is handed over.
        let claim = match lane.store.claim(want, b.lease).await {
            Ok(c) => c,
            Err(e) => {
                window.add_permits(want);
                if e.is_wrong_type() {
                    lane.redis.up();
                    if !wrong_type_logged {
                        tracing::error!(error = %e, "the key is not a sorted set; producers must ZADD to it. This business waits until the key is fixed; the others go on");
                        wrong_type_logged = true;
                    }
                    if !sleep_or_stop(b.poll_interval.max(Duration::from_secs(1))).await {
                        break;
                    }
                } else {
                    lane.redis.down(&e);
                    if !sleep_or_stop(redis_backoff.next_delay()).await {
                        break;
                    }
                }
                continue;
            }
        };
        let claimed_at = Instant::now();
        if index == 0 {
            lane.lead_claims.fetch_add(1, Ordering::Relaxed);
        }
        lane.redis.up();
        redis_backoff.reset();
        if wrong_type_logged {
            tracing::info!("the key is a sorted set again; dispatching resumes");
            wrong_type_logged = false;
        }
        if claim.recovered > 0 {
            METRICS
                .recovered
                .with_label_values(&[&b.name])
                .inc_by(claim.recovered);
            tracing::warn!(
                recovered = claim.recovered,
                "recovered members whose lease expired (a dispatcher died or stalled); they will be published again"
            );
        }
        let got = claim.members.len();
        let record: Option<Arc<str>> = claim.record.as_deref().map(Arc::from);
        if let Some(r) = &record {
            let _ = tx.send(ToSettle::Claimed(r.clone(), got));
        }
        window.add_permits(want - got);
        if got == 0 {
            idle(lane, index, &claim, claimed_at, stop).await;
            continue;
        }
        METRICS
            .claimed
            .with_label_values(&[&b.name])
            .inc_by(got as u64);
        if got == want {
            // A full batch: likely more is due, so bring the others in.
            lane.all_wake.notify_waiters();
        }

        // Every publish of the batch is started before any is awaited: lapin
        // queues their frames in order and its I/O loop writes them in one
        // go, instead of one wake-up and round trip per message.
        let key = &lane.store.keys().pending;
        let publishes = futures::future::join_all(
            claim
                .members
                .iter()
                .map(|c| amqp::publish(&ch, b, key, c, claim.now_ms)),
        );
        let Some(results) = publish_or_give_up(publishes, broker).await else {
            // The frames never left: the connection is dead without saying
            // so. Hand the batch back and start over on a new channel.
            tracing::warn!(
                members = claim.members.len(),
                "publishing stalled for {PUBLISH_STALL:?} while the broker was not blocking; handing the batch back and reopening the channel"
            );
            let _ = tx.send(ToSettle::Unpublished(claim.members, record));
            channel = None;
            continue;
        };
        let mut published = 0u64;
        let mut unpublished = Vec::new();
        let mut first_error = None;
        for (c, result) in claim.members.into_iter().zip(results) {
            match result {
                Ok(confirm) => {
                    published += 1;
                    let Claimed {
                        member,
                        due_ms,
                        attempt,
                    } = c;
                    let _ = tx.send(ToSettle::Published(
                        Outstanding {
                            member,
                            due_ms,
                            attempt,
                            record: record.clone(),
                            claim_now_ms: claim.now_ms,
                            claimed_at,
                        },
                        confirm,
                    ));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    unpublished.push(c);
                }
            }
        }
        if let Some(e) = first_error {
            if !channel_error_logged {
                tracing::warn!(error = %e, unpublished = unpublished.len(), "publish failed; handing those members back and reopening the channel");
                channel_error_logged = true;
            }
            let _ = tx.send(ToSettle::Unpublished(unpublished, record));
            channel = None;
        }
        METRICS
            .published
            .with_label_values(&[&b.name])
            .inc_by(published);
    }
    channel
}

/// How long handing a batch to lapin may take before the connection is
/// presumed dead. Sending needs no answer from the broker, so only a broken
/// connection (or a blocked one, which is waited out) takes this long.
const PUBLISH_STALL: Duration = Duration::from_secs(30);

/// Waits for a batch of publishes to be handed to the socket; `None` if that
/// stalls for [`PUBLISH_STALL`] while the broker is not blocking publishers.
async fn publish_or_give_up<F: std::future::Future>(
    publishes: F,
    broker: &Broker,
) -> Option<F::Output> {
    tokio::pin!(publishes);
    loop {
        match tokio::time::timeout(PUBLISH_STALL, &mut publishes).await {
            Ok(results) => return Some(results),
            Err(_) if broker.is_blocked() => continue,
            Err(_) => return None,
        }
    }
}

/// Sleeps after a claim that found nothing due: until the next due time, a
/// wake-up hint, or the watchdog bound, whichever is first.
async fn idle(
    lane: &Lane,
    index: usize,
    claim: &crate::store::Claim,
    claimed_at: Instant,
    stop: &CancellationToken,
) {
    let max_idle = lane.max_idle();
    if index == 0 {
        let until_due = claim
            .next_due_ms
            .map(|next| Duration::from_millis((next - claim.now_ms).max(0) as u64))
            .unwrap_or(max_idle)
            .min(max_idle);
        let deadline = tokio::time::Instant::from_std(claimed_at) + until_due;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = lane.lead_wake.notified() => {}
        }
    } else {
        // Only the leader polls, so an idle business costs one command per
        // idle bound however many scanners it has. The others wait for it to
        // call them, and claim on their own only if it has stopped moving.
        loop {
            let seen = lane.lead_claims.load(Ordering::Relaxed);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = lane.all_wake.notified() => return,
                _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
            if lane.lead_claims.load(Ordering::Relaxed) == seen {
                return;
            }
        }
    }
}

/// Settles published members by their confirms, in batches: everything that
/// has resolved by the time the previous batch is written goes in the next.
async fn settle(
    lane: Arc<Lane>,
    mut rx: mpsc::UnboundedReceiver<ToSettle>,
    window: Arc<Semaphore>,
    drain_deadline: Arc<tokio::sync::OnceCell<tokio::time::Instant>>,
) {
    let b = lane.business.clone();
    let mut next_seq = 0u64;
    let mut outstanding: BTreeMap<u64, Outstanding> = BTreeMap::new();
    let mut confirms = FuturesUnordered::new();
    let mut open = true;
    let lease_check = (b.lease / 3).max(Duration::from_millis(100));
    let mut extend_tick = tokio::time::interval(lease_check);
    extend_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Batch::default();

    loop {
        if !open && outstanding.is_empty() {
            break;
        }
        let deadline = if open {
            None
        } else {
            drain_deadline.get().copied()
        };
        tokio::select! {
            biased;
            msg = rx.recv(), if open => match msg {
                Some(ToSettle::Published(o, confirm)) => {
                    let seq = next_seq;
                    next_seq += 1;
                    outstanding.insert(seq, o);
                    confirms.push(confirm.map(move |r| (seq, r)));
                }
                Some(ToSettle::Claimed(record, n)) => {
                    batch.records.insert(record, n);
                }
                Some(ToSettle::Unpublished(members, record)) => {
                    let n = members.len();
                    for c in members {
                        batch.release(c.member, c.due_ms, record.clone());
                    }
                    flush(&lane, &mut batch, drain_deadline.get().copied()).await;
                    window.add_permits(n);
                }
                None => open = false,
            },
            Some((seq, result)) = confirms.next(), if !confirms.is_empty() => {
                // Everything already resolved joins this batch.
                let mut ready = vec![(seq, result)];
                while ready.len() < 4096 {
                    match confirms.next().now_or_never() {
                        Some(Some(r)) => ready.push(r),
                        _ => break,
                    }
                }
                let mut done = 0usize;
                for (seq, result) in ready {
                    if let Some(o) = outstanding.remove(&seq) {
                        batch.add(o, result);
                        done += 1;
                    }
                }
                // The window bounds what the broker owes us; writing the
                // outcomes to Redis is a separate stage, so the scanner may
                // publish again while they are written.
                window.add_permits(done);
                flush(&lane, &mut batch, drain_deadline.get().copied()).await;
            }
            _ = extend_tick.tick() => {
                let old: Vec<Vec<u8>> = outstanding
                    .values()
                    .filter(|o| o.claimed_at.elapsed() >= lease_check)
                    .map(|o| o.member.clone())
                    .collect();
                if !old.is_empty() {
                    if let Err(e) = lane.store.extend(&old, b.lease).await {
                        tracing::warn!(error = %e, members = old.len(), "could not extend leases of members awaiting a confirm");
                    }
                }
            }
            _ = sleep_until_opt(deadline) => {
                let owed = std::mem::take(&mut outstanding);
                tracing::warn!(
                    unconfirmed = owed.len(),
                    "shutdown_timeout reached with confirms still owed; handing those members back to pending"
                );
                for o in owed.into_values() {
                    batch.release(o.member, o.due_ms, o.record);
                }
                flush(&lane, &mut batch, drain_deadline.get().copied()).await;
                break;
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => futures::future::pending().await,
    }
}

/// A member the broker refused, on its way back to pending or the dead set.
struct Refused {
    member: Vec<u8>,
    due_ms: i64,
    attempt: u32,
    record: Option<Arc<str>>,
}

/// Outcomes gathered for one round of Redis writes, and the claim records
/// still owed settles.
#[derive(Default)]
struct Batch {
    ack: Vec<Vec<u8>>,
    ack_records: Vec<Arc<str>>,
    lateness: Vec<f64>,
    returned: Vec<Refused>,
    returned_reason: String,
    nacked: Vec<Refused>,
    rejected: Vec<Refused>,
    rejected_reason: String,
    release: Vec<(Vec<u8>, i64)>,
    release_records: Vec<Arc<str>>,
    /// Members of each claim record not settled in Redis yet.
    records: HashMap<Arc<str>, usize>,
    /// Records whose members are all settled: to delete.
    forget: Vec<String>,
}

impl Batch {
    fn release(&mut self, member: Vec<u8>, due_ms: i64, record: Option<Arc<str>>) {
        self.release.push((member, due_ms));
        self.release_records.extend(record);
    }

    /// Counts members of these records as settled, before their write is
    /// sent; returns the records that this completes.
    fn count_down(&mut self, records: &[Arc<str>]) -> Vec<String> {
        let mut done = Vec::new();
        for r in records {
            if let Some(left) = self.records.get_mut(r) {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.records.remove(r);
                    done.push(r.to_string());
                }
            }
        }
        done
    }

    /// After a failed write: those members stay in flight and whoever
    /// recovers them needs their records, so keep them for good; the
    /// recovery deletes them afterwards.
    fn keep(&mut self, records: &[Arc<str>]) {
        for r in records {
            self.records.remove(r);
        }
    }

    /// After a retry or release write that carried no record deletions:
    /// queue the records it completed for one HDEL, or keep them if it
    /// failed.
    fn written(&mut self, records: &[Arc<str>], ok: bool) {
        let done = self.count_down(records);
        if ok {
            self.forget.extend(done);
        } else {
            self.keep(records);
        }
    }

    fn add(&mut self, o: Outstanding, result: lapin::Result<Confirmation>) {
        let refused = |o: Outstanding| Refused {
            member: o.member,
            due_ms: o.due_ms,
            attempt: o.attempt,
            record: o.record,
        };
        match result {
            Ok(Confirmation::Ack(None)) => {
                let now = o.claim_now_ms as f64 + o.claimed_at.elapsed().as_secs_f64() * 1000.0;
                self.lateness
                    .push(((now - o.due_ms as f64) / 1000.0).max(0.0));
                self.ack.push(o.member);
                self.ack_records.extend(o.record);
            }
            // An unroutable mandatory publish is still acked: the return
            // rides on the ack and must not be taken for delivery.
            Ok(Confirmation::Ack(Some(ret))) | Ok(Confirmation::Nack(Some(ret))) => {
                self.returned_reason = format!(
                    "returned as unroutable ({} {})",
                    ret.reply_code,
                    ret.reply_text.as_str()
                );
                self.returned.push(refused(o));
            }
            Ok(Confirmation::Nack(None)) => self.nacked.push(refused(o)),
            Ok(Confirmation::NotRequested) => self.release(o.member, o.due_ms, o.record),
            // The broker refused one message and closed the channel: every
            // confirm still owed on it fails with the same error, including
            // those of earlier messages whose confirms were not sent yet, and
            // they arrive in no particular order. Count an attempt only for
            // the refused message, so it ends in the dead set instead of
            // wedging the scanner; the others go back untouched.
            Err(e) => match precondition_failure(&e) {
                Some(reason) => match max_message_size(&reason) {
                    // The error names the limit: blame exactly what exceeds it.
                    Some(max) if o.member.len() > max => {
                        self.rejected_reason = reason;
                        self.rejected.push(refused(o));
                    }
                    Some(_) => self.release(o.member, o.due_ms, o.record),
                    // Otherwise one member per batch, so a message the broker
                    // keeps refusing still runs out of attempts.
                    None if self.rejected.is_empty() => {
                        self.rejected_reason = reason;
                        self.rejected.push(refused(o));
                    }
                    None => self.release(o.member, o.due_ms, o.record),
                },
                None => self.release(o.member, o.due_ms, o.record),
            },
        }
    }
}

/// RabbitMQ refuses a body over `max_message_size` with "message size N is
/// larger than configured max size M"; M, when the error says so.
fn max_message_size(reason: &str) -> Option<usize> {
    let rest = reason.split("larger than configured max size ").nth(1)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn precondition_failure(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            let text = amqp.to_string();
            (text.contains("PRECONDITION_FAILED") || text.contains("precondition"))
                .then(|| format!("refused by the broker ({text})"))
        }
        _ => None,
    }
}

/// Runs one Redis write until it succeeds, or `None` once `give_up` passes.
async fn until_written<T, F, Fut>(
    lane: &Lane,
    give_up: Instant,
    backoff: &mut Backoff,
    mut write: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    loop {
        match write().await {
            Ok(v) => {
                lane.redis.up();
                return Some(v);
            }
            Err(e) => {
                lane.redis.down(&e);
                if Instant::now() > give_up {
                    return None;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Writes a batch of outcomes to Redis, retrying while Redis is away: an ack
/// that is not written becomes a duplicate once the lease expires.
async fn flush(lane: &Lane, batch: &mut Batch, drain_deadline: Option<tokio::time::Instant>) {
    let b = &lane.business;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    // Retry while the lease still protects the members, but never past a
    // stop's deadline: what is not written then is recovered later.
    let mut give_up = Instant::now() + b.lease;
    if let Some(d) = drain_deadline {
        give_up = give_up.min(d.into_std() + Duration::from_secs(1));
    }
    if !batch.ack.is_empty() {
        let records = std::mem::take(&mut batch.ack_records);
        let done = batch.count_down(&records);
        let ack = &batch.ack;
        let ok = until_written(lane, give_up, &mut backoff, || lane.store.ack(ack, &done))
            .await
            .is_some();
        if !ok {
            tracing::error!(members = ack.len(), "could not record confirms in Redis in time; these members will be recovered and published again");
            batch.keep(&records);
        }
        METRICS
            .confirmed
            .with_label_values(&[&b.name])
            .inc_by(batch.ack.len() as u64);
        let h = METRICS.lateness.with_label_values(&[&b.name]);
        for l in &batch.lateness {
            h.observe(*l);
        }
        batch.ack.clear();
        batch.lateness.clear();
    }
    let groups = [
        (
            std::mem::take(&mut batch.returned),
            std::mem::take(&mut batch.returned_reason),
            "returned",
        ),
        (
            std::mem::take(&mut batch.nacked),
            "nacked by the broker".to_string(),
            "nacked",
        ),
        (
            std::mem::take(&mut batch.rejected),
            std::mem::take(&mut batch.rejected_reason),
            "rejected",
        ),
    ];
    for (members, reason, kind) in groups {
        if members.is_empty() {
            continue;
        }
        match kind {
            "returned" => METRICS
                .returned
                .with_label_values(&[&b.name])
                .inc_by(members.len() as u64),
            "nacked" => METRICS
                .nacked
                .with_label_values(&[&b.name])
                .inc_by(members.len() as u64),
            _ => {}
        }
        let max_attempt = members.iter().map(|r| r.attempt).max().unwrap_or(0);
        let mut bodies = Vec::with_capacity(members.len());
        let mut records = Vec::new();
        for r in members {
            bodies.push((r.member, r.due_ms));
            records.extend(r.record);
        }
        let retried = until_written(lane, give_up, &mut backoff, || {
            lane.store.retry(
                &bodies,
                &reason,
                b.max_attempts,
                b.retry_backoff,
                b.retry_backoff_max,
            )
        })
        .await;
        batch.written(&records, retried.is_some());
        let Some(out) = retried else {
            tracing::error!(members = bodies.len(), reason = %reason, "could not reschedule refused members in Redis in time; they stay in flight and are recovered after their lease");
            continue;
        };
        if out.retried > 0 {
            METRICS
                .retried
                .with_label_values(&[&b.name, kind])
                .inc_by(out.retried);
            tracing::warn!(
                reason = %reason,
                members = out.retried,
                attempt = max_attempt,
                exchange = %b.exchange,
                routing_key = %b.routing_key,
                "publish not delivered; rescheduled with backoff"
            );
        }
        if out.dead > 0 {
            METRICS
                .dead_lettered
                .with_label_values(&[&b.name, kind])
                .inc_by(out.dead);
            tracing::error!(
                reason = %reason,
                members = out.dead,
                attempts = b.max_attempts,
                exchange = %b.exchange,
                routing_key = %b.routing_key,
                "giving up after max_attempts; moved to the dead set (see `delayd dead list`)"
            );
        }
    }
    if !batch.release.is_empty() {
        let release = &batch.release;
        let released =
            until_written(lane, give_up, &mut backoff, || lane.store.release(release)).await;
        match released {
            Some(n) => METRICS.released.with_label_values(&[&b.name]).inc_by(n),
            None => tracing::error!(members = release.len(), "could not hand unconfirmed members back in Redis in time; they are recovered after their lease"),
        }
        batch.release.clear();
        let records = std::mem::take(&mut batch.release_records);
        batch.written(&records, released.is_some());
    }
    // Claims completed by retries or releases (rare): their records go in
    // one more call.
    if !batch.forget.is_empty() {
        let forget = &batch.forget;
        if until_written(lane, give_up, &mut backoff, || lane.store.forget(forget))
            .await
            .is_none()
        {
            // Only the record (a few KB) stays behind; a later recovery on
            // this key deletes it.
            tracing::warn!(
                records = forget.len(),
                "could not delete settled claim records in time"
            );
        }
        batch.forget.clear();
    }
}
