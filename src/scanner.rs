//! One scanner: claim due members, publish them, and (in its settler task)
//! settle each one by the broker's answer.
//!
//! The scanner is only ever cancelled at safe points: before a claim and
//! while it sleeps. Once a claim has run, every member it returned is handed
//! to the settler, which answers for it: acked, retried, dead-lettered or
//! released back to pending. Nothing claimed is forgotten.

use std::collections::{BTreeMap, HashMap};
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
use crate::rate::{Limiter, Take};
use crate::store::{Back, BackPolicy, Claimed, Held, Store};
use crate::telemetry::{Backoff, Health, METRICS};

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
    /// The business's publish-rate cap and the most one claim may take
    /// from it, when `max_rate` is set.
    pub limiter: Option<(Arc<Limiter>, usize)>,
    /// Redis reachability, shared by the process.
    pub redis: Arc<Health>,
    /// Claims the leader has made: the others check that it still moves.
    pub lead_claims: AtomicU64,
    /// Set while the exchange is missing or forbidden.
    pub pause: Pause,
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

/// The claim a member came from, shared by its members in the settler.
struct ClaimInfo {
    /// Settle writes name it; they act only on members the claim still holds.
    tag: u16,
    /// The record of first attempts' due times, if the claim wrote one.
    record: Option<Arc<str>>,
    /// Redis's clock at claim time, plus `at.elapsed()`, gives a wall time
    /// on Redis's clock without asking it again.
    now_ms: i64,
    at: Instant,
}

/// A member from its claim until it is settled.
struct Holding {
    claimed: Arc<Claimed>,
    claim: Arc<ClaimInfo>,
    /// Published, its confirm still owed.
    published: bool,
    /// A return that carried this member's body: whatever its confirm says,
    /// the broker did not route it.
    returned: Option<String>,
}

/// Handed from the scanner to its settler.
enum ToSettle {
    /// Claimed, not yet published: sent before the first publish, so the
    /// settler extends the leases of members stuck in a blocked publish
    /// and hands them back at the stop deadline.
    Claimed(Arc<ClaimInfo>, Vec<(u64, Arc<Claimed>)>),
    /// Published; the confirm is owed.
    Published(u64, lapin::PublisherConfirm),
    /// Claimed but never published (the channel broke mid-batch, the
    /// publish stalled, or the stop deadline passed).
    Unpublished(Vec<u64>),
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
            settle(lane.clone(), rx, window.clone(), drain_deadline.clone()).in_current_span(),
        );
        // The channel outlives the settler: dropping it closes it, and a
        // closed channel fails the confirms still owed, which would hand
        // back members the broker already has.
        let channel = scan(&lane, index, &broker, &stop, &window, &tx, &drain_deadline).await;
        drop(tx);
        if let Err(e) = settler.await {
            tracing::error!(error = %e, "settler task failed; its leases will be recovered");
        }
        drop(channel);
    }
    .instrument(span)
    .await
}

#[allow(clippy::too_many_arguments)]
async fn scan(
    lane: &Lane,
    index: usize,
    broker: &Broker,
    stop: &CancellationToken,
    window: &Arc<Semaphore>,
    tx: &mpsc::UnboundedSender<ToSettle>,
    drain_deadline: &tokio::sync::OnceCell<tokio::time::Instant>,
) -> Option<Channel> {
    let b = &lane.business;
    let mut channel: Option<Channel> = None;
    let mut redis_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut amqp_backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut topology_backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut channel_error_logged = false;
    let mut wrong_type_logged = false;
    let mut seq = 0u64;
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
        // The exchange is gone or publishing is forbidden: claiming would
        // only hand members back at round-trip speed. Wait, with backoff,
        // until the exchange answers a passive declare again.
        if lane.pause.is_paused() {
            if !sleep_or_stop(topology_backoff.next_delay()).await {
                break;
            }
            let Some(conn) = broker.ready(stop).await else {
                break;
            };
            match amqp::exchange_exists(&conn, &b.exchange).await {
                Ok(()) => {
                    lane.pause.resume(&b.name);
                    topology_backoff.reset();
                    channel = None;
                }
                Err(_) => continue,
            }
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
        // Tokens granted for this claim; the ones it does not use go back.
        let mut granted = None;
        if let Some((limiter, burst)) = &lane.limiter {
            if want > *burst {
                window.add_permits(want - *burst);
                want = *burst;
            }
            let take = tokio::select! {
                _ = stop.cancelled() => None,
                t = limiter.take(want, *burst) => Some(t),
            };
            match take {
                None => {
                    window.add_permits(want);
                    break;
                }
                Some(Ok(Take::Granted(n))) => {
                    window.add_permits(want - n.min(want));
                    want = n.min(want);
                    granted = Some(want);
                }
                Some(Ok(Take::Wait(d))) => {
                    window.add_permits(want);
                    if !sleep_or_stop(d).await {
                        break;
                    }
                    continue;
                }
                Some(Err(e)) => {
                    window.add_permits(want);
                    lane.redis.down(&e);
                    if !sleep_or_stop(redis_backoff.next_delay()).await {
                        break;
                    }
                    continue;
                }
            }
        }

        // From here on, no cancellation until every claimed member is handed over.
        let claim = match lane.store.claim(want, b.lease).await {
            Ok(c) => c,
            Err(e) => {
                window.add_permits(want);
                give_back(lane, granted, 0);
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
        if claim.dead_no_body > 0 {
            METRICS
                .dead_lettered
                .with_label_values(&[&b.name, "no body"])
                .inc_by(claim.dead_no_body);
            tracing::error!(
                dead = claim.dead_no_body,
                reason = "no body",
                "ids came due with no body in the body hash; moved to the dead set unpublished (schedule body and id in one MULTI)"
            );
        }
        if claim.dead_lease_expired > 0 {
            METRICS
                .dead_lettered
                .with_label_values(&[&b.name, "lease expired"])
                .inc_by(claim.dead_lease_expired);
            tracing::error!(
                dead = claim.dead_lease_expired,
                max_attempts = b.max_attempts,
                "members whose lease expired on their last allowed attempt moved to the dead set (a process keeps dying or stalling on them); see delayd dead list"
            );
        }
        if claim.deduplicated > 0 {
            METRICS
                .deduplicated
                .with_label_values(&[&b.name])
                .inc_by(claim.deduplicated);
        }
        let got = claim.members.len();
        window.add_permits(want - got);
        give_back(lane, granted, got);
        if got == 0 && claim.dead_no_body + claim.deduplicated > 0 {
            // The whole batch was dropped, and more may be due behind it.
            continue;
        }
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
        let info = Arc::new(ClaimInfo {
            tag: claim.tag,
            record: claim.record.as_deref().map(Arc::from),
            now_ms: claim.now_ms,
            at: claimed_at,
        });
        let members: Vec<(u64, Arc<Claimed>)> = claim
            .members
            .into_iter()
            .map(|c| {
                seq += 1;
                (seq, Arc::new(c))
            })
            .collect();
        let _ = tx.send(ToSettle::Claimed(info, members.clone()));
        if stop.is_cancelled() {
            // A claim that Redis answered after the stop (it was frozen, or
            // slow): hand it back unpublished rather than publish it as the
            // process leaves.
            let _ = tx.send(ToSettle::Unpublished(
                members.iter().map(|(s, _)| *s).collect(),
            ));
            continue;
        }

        // Every publish of the batch is started before any is awaited: lapin
        // queues their frames in order and its I/O loop writes them in one
        // go, instead of one wake-up and round trip per message.
        let key = &lane.store.keys().pending;
        let progress = AtomicU64::new(0);
        let publishes = futures::future::join_all(members.iter().map(|(_, c)| {
            let (progress, ch) = (&progress, &ch);
            async move {
                let r = amqp::publish(ch, b, key, c, claim.now_ms).await;
                progress.fetch_add(1, Ordering::Relaxed);
                r
            }
        }));
        let blocked = || broker.is_blocked();
        let results = match publish_or_give_up(publishes, &progress, blocked, stop, drain_deadline)
            .await
        {
            Published::All(results) => results,
            Published::Stalled => {
                // The frames never left: the connection is dead without
                // saying so. Hand the batch back and start over on a new
                // channel.
                tracing::warn!(
                    members = members.len(),
                    "publishing stalled for {PUBLISH_STALL:?} while the broker was not blocking; handing the batch back and reopening the channel"
                );
                let _ = tx.send(ToSettle::Unpublished(
                    members.iter().map(|(s, _)| *s).collect(),
                ));
                channel = None;
                continue;
            }
            Published::Deadline => {
                // Stopping, and the broker still blocks: what never left
                // goes back to pending now (the settler does it), rather
                // than waiting for a lease to expire.
                tracing::warn!(
                    members = members.len(),
                    "shutdown_timeout reached while the broker still blocks publishing; handing the batch back"
                );
                let _ = tx.send(ToSettle::Unpublished(
                    members.iter().map(|(s, _)| *s).collect(),
                ));
                break;
            }
        };
        let mut published = 0u64;
        let mut unpublished = Vec::new();
        let mut first_error = None;
        for ((s, _), result) in members.iter().zip(results) {
            match result {
                Ok(confirm) => {
                    published += 1;
                    let _ = tx.send(ToSettle::Published(*s, confirm));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    unpublished.push(*s);
                }
            }
        }
        if let Some(e) = first_error {
            let topology = topology_error(&e);
            if let Some(reason) = &topology {
                lane.pause.pause(&b.name, reason);
            } else if !channel_error_logged {
                tracing::warn!(error = %e, unpublished = unpublished.len(), "publish failed; handing those members back and reopening the channel");
                channel_error_logged = true;
            }
            let _ = tx.send(ToSettle::Unpublished(unpublished));
            // Any other broker error is retried with backoff, not at once:
            // one that repeats would otherwise spin.
            if topology.is_none() && !sleep_or_stop(amqp_backoff.next_delay()).await {
                break;
            }
            channel = None;
        } else {
            amqp_backoff.reset();
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

/// How handing a batch to lapin ended.
enum Published<T> {
    /// Every publish returned (each with its confirm or its error).
    All(T),
    /// Nothing moved for [`PUBLISH_STALL`] while the broker was not blocking.
    Stalled,
    /// The stop deadline passed while the broker still blocked.
    Deadline,
}

/// Waits for a batch of publishes to be handed to the socket. A blocked
/// broker is waited out, but never past the stop deadline. The stall is
/// measured from the last publish that went out (`progress` counts them),
/// not from the batch's start: a slow link or credit flow that still moves
/// frames must not have its batch handed back and published twice.
async fn publish_or_give_up<F: std::future::Future>(
    publishes: F,
    progress: &AtomicU64,
    blocked: impl Fn() -> bool,
    stop: &CancellationToken,
    drain_deadline: &tokio::sync::OnceCell<tokio::time::Instant>,
) -> Published<F::Output> {
    tokio::pin!(publishes);
    let mut stalled_since = tokio::time::Instant::now();
    let mut seen = progress.load(Ordering::Relaxed);
    loop {
        let deadline = drain_deadline.get().copied();
        tokio::select! {
            results = &mut publishes => return Published::All(results),
            // Only a blocked broker is given up on at the deadline: frames
            // already handed to lapin go out, and their members must be
            // settled by their confirms, not handed back.
            _ = sleep_until_opt(deadline.filter(|_| blocked())) => return Published::Deadline,
            // A stop sets the deadline just before it cancels: look again.
            _ = stop.cancelled(), if deadline.is_none() && !stop.is_cancelled() => {}
            _ = tokio::time::sleep_until(stalled_since + PUBLISH_STALL) => {
                let now_seen = progress.load(Ordering::Relaxed);
                if now_seen == seen && !blocked() {
                    return Published::Stalled;
                }
                seen = now_seen;
                stalled_since = tokio::time::Instant::now();
            }
        }
    }
}

/// Returns to the business's budget the tokens of `granted` that a claim of
/// `used` members did not spend, off the claim loop: a lost refund only
/// slows the business down a little, never speeds it up.
fn give_back(lane: &Lane, granted: Option<usize>, used: usize) {
    let (Some(granted), Some((limiter, burst))) = (granted, &lane.limiter) else {
        return;
    };
    if granted <= used || !matches!(**limiter, Limiter::Shared(_)) {
        return;
    }
    let (limiter, burst, unused) = (limiter.clone(), *burst, granted - used);
    tokio::spawn(async move {
        if let Err(e) = limiter.give_back(unused, burst).await {
            tracing::debug!(error = %e, unused, "could not return unused publish budget");
        }
    });
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
        lead_idle(lane, claim, claimed_at, deadline, stop).await;
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

/// The shortest time between two looks a wake-up hint can cause: a lane
/// looks at most 200 times a second however fast producers write, and a
/// member written already due still goes out within a few milliseconds.
const WAKE_GAP: Duration = Duration::from_millis(5);

/// The leader's sleep until `deadline`. A wake-up hint (a producer's write,
/// or a scanner that left work behind) costs a look at the earliest pending
/// member, not a claim, and at most one look per [`WAKE_GAP`]: a write due
/// next week only confirms the deadline, a write due sooner moves it, and
/// one due now ends the sleep.
async fn lead_idle(
    lane: &Lane,
    claim: &crate::store::Claim,
    claimed_at: Instant,
    mut deadline: tokio::time::Instant,
    stop: &CancellationToken,
) {
    let claimed_at = tokio::time::Instant::from_std(claimed_at);
    let mut last_look: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = lane.lead_wake.notified() => {}
        }
        if let Some(at) = last_look {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(deadline.min(at + WAKE_GAP)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
        }
        last_look = Some(tokio::time::Instant::now());
        // Any doubt (an error, a reply that cannot be placed) is a claim.
        let Ok(head) = lane.store.head_due_ms().await else {
            return;
        };
        let Some(head) = head else {
            continue;
        };
        let head_at = claimed_at
            .checked_add(Duration::from_millis(
                head.saturating_sub(claim.now_ms).max(0) as u64,
            ))
            .unwrap_or(deadline);
        if head_at <= tokio::time::Instant::now() {
            return;
        }
        deadline = deadline.min(head_at);
    }
}

/// Settles claimed members by their confirms, in batches: everything that
/// has resolved by the time the previous batch is written goes in the next.
/// It holds every member from its claim until it is settled, extends their
/// leases while they wait, and at the stop deadline hands back the rest.
async fn settle(
    lane: Arc<Lane>,
    mut rx: mpsc::UnboundedReceiver<ToSettle>,
    window: Arc<Semaphore>,
    drain_deadline: Arc<tokio::sync::OnceCell<tokio::time::Instant>>,
) {
    let b = lane.business.clone();
    let mut held: HashMap<u64, Holding> = HashMap::new();
    let mut confirms = FuturesUnordered::new();
    let mut open = true;
    let lease_check = (b.lease / 3).max(Duration::from_millis(100));
    let mut extend_tick = tokio::time::interval(lease_check);
    extend_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Batch::default();

    loop {
        if !open && held.is_empty() {
            break;
        }
        let deadline = drain_deadline.get().copied();
        tokio::select! {
            biased;
            // First, so a steady stream of confirms cannot starve it.
            _ = extend_tick.tick() => {
                extend(&lane, &held, lease_check).await;
            }
            _ = sleep_until_opt(deadline) => {
                if open {
                    // The scanner hands back what it still publishes.
                    while let Ok(msg) = rx.try_recv() {
                        take(&mut held, &mut confirms, &mut batch, msg);
                    }
                }
                settle_at_deadline(&lane, &mut held, &mut confirms, &mut batch).await;
                break;
            }
            msg = rx.recv(), if open => match msg {
                Some(ToSettle::Unpublished(seqs)) => {
                    let n = seqs.len();
                    take(&mut held, &mut confirms, &mut batch, ToSettle::Unpublished(seqs));
                    flush(&lane, &mut batch, deadline).await;
                    window.add_permits(n);
                }
                Some(msg) => take(&mut held, &mut confirms, &mut batch, msg),
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
                let done = ready.len();
                settle_confirms(&lane, &mut held, &mut batch, ready);
                // The window bounds what the broker owes us; writing the
                // outcomes to Redis is a separate stage, so the scanner may
                // publish again while they are written.
                window.add_permits(done);
                flush(&lane, &mut batch, deadline).await;
            }
        }
    }
}

/// At the stop deadline: settles what the broker has confirmed, then hands
/// back the rest, but only while Redis answers. A member the broker
/// confirmed is acked (or, if that cannot be written, left in flight), never
/// handed back; and a hand-back sent to a Redis that does not answer could
/// run after the broker confirms those members too, so then they stay in
/// flight and are recovered after their lease.
async fn settle_at_deadline(
    lane: &Lane,
    held: &mut HashMap<u64, Holding>,
    confirms: &mut Confirms,
    batch: &mut Batch,
) {
    settle_ready(lane, held, confirms, batch);
    flush(lane, batch, Some(tokio::time::Instant::now())).await;
    // Confirms that came in while those writes waited.
    settle_ready(lane, held, confirms, batch);
    flush(lane, batch, Some(tokio::time::Instant::now())).await;
    if held.is_empty() {
        return;
    }
    let answers = tokio::time::timeout(Duration::from_secs(1), lane.store.head_due_ms())
        .await
        .is_ok_and(|r| r.is_ok());
    if !answers {
        tracing::warn!(
            unconfirmed = held.len(),
            "shutdown_timeout reached with confirms still owed and Redis not answering; those members stay in flight and are recovered after their lease"
        );
        return;
    }
    tracing::warn!(
        unconfirmed = held.len(),
        "shutdown_timeout reached with confirms still owed; handing those members back to pending"
    );
    for (_, h) in held.drain() {
        batch.add(h, Outcome::Release);
    }
    flush(lane, batch, Some(tokio::time::Instant::now())).await;
}

/// Settles every confirm that has already resolved.
fn settle_ready(
    lane: &Lane,
    held: &mut HashMap<u64, Holding>,
    confirms: &mut Confirms,
    batch: &mut Batch,
) {
    let mut ready = Vec::new();
    while let Some(Some(r)) = confirms.next().now_or_never() {
        ready.push(r);
    }
    if !ready.is_empty() {
        settle_confirms(lane, held, batch, ready);
    }
}

type Confirms =
    FuturesUnordered<futures::future::BoxFuture<'static, (u64, lapin::Result<Confirmation>)>>;

/// Takes one message from the scanner into the settler's state.
fn take(
    held: &mut HashMap<u64, Holding>,
    confirms: &mut Confirms,
    batch: &mut Batch,
    msg: ToSettle,
) {
    match msg {
        ToSettle::Claimed(claim, members) => {
            if let Some(r) = &claim.record {
                batch.records.insert(r.clone(), members.len());
            }
            for (seq, claimed) in members {
                held.insert(
                    seq,
                    Holding {
                        claimed,
                        claim: claim.clone(),
                        published: false,
                        returned: None,
                    },
                );
            }
        }
        ToSettle::Published(seq, confirm) => {
            if let Some(h) = held.get_mut(&seq) {
                h.published = true;
                confirms.push(Box::pin(async move { (seq, confirm.await) }));
            }
        }
        ToSettle::Unpublished(seqs) => {
            for seq in seqs {
                if let Some(h) = held.remove(&seq) {
                    batch.add(h, Outcome::Release);
                }
            }
        }
    }
}

/// Extends the leases of every member held longer than `older_than`,
/// published or not: a batch stuck behind a blocked connection is as much
/// ours as one awaiting its confirms.
async fn extend(lane: &Lane, held: &HashMap<u64, Holding>, older_than: Duration) {
    let mut groups: BTreeMap<u16, Vec<&[u8]>> = BTreeMap::new();
    for h in held.values() {
        if h.claim.at.elapsed() >= older_than {
            groups
                .entry(h.claim.tag)
                .or_default()
                .push(h.claimed.member.as_slice());
        }
    }
    if groups.is_empty() {
        return;
    }
    let groups: Vec<Held<&[u8]>> = groups.into_iter().collect();
    let n: usize = groups.iter().map(|g| g.1.len()).sum();
    if let Err(e) = lane.store.extend(&groups, lane.business.lease).await {
        tracing::warn!(error = %e, members = n, "could not extend leases of members awaiting a confirm");
    }
}

/// Classifies resolved confirms, matching every return to the member it
/// carries rather than to the confirm lapin pinned it on.
fn settle_confirms(
    lane: &Lane,
    held: &mut HashMap<u64, Holding>,
    batch: &mut Batch,
    ready: Vec<(u64, lapin::Result<Confirmation>)>,
) {
    let mut resolved = Vec::with_capacity(ready.len());
    let mut returns = Vec::new();
    for (seq, result) in ready {
        let Some(h) = held.remove(&seq) else { continue };
        let outcome = match result {
            // lapin hands a pending basic.return to whichever confirm it
            // completes next, and completes a multiple ack's tags in no
            // fixed order: the ack is this member's, the return may not be.
            Ok(Confirmation::Ack(ret)) => {
                returns.extend(ret);
                Outcome::Ack
            }
            Ok(Confirmation::Nack(ret)) => {
                returns.extend(ret);
                Outcome::Nack
            }
            Ok(Confirmation::NotRequested) => Outcome::Release,
            Err(e) => error_outcome(lane, &e, &h, batch),
        };
        resolved.push((h, outcome));
    }
    for ret in returns {
        let reason = format!(
            "returned as unroutable ({} {})",
            ret.reply_code,
            ret.reply_text.as_str()
        );
        let key = &lane.store.keys().pending;
        let is_it = |h: &Holding| amqp::is_return_of(&lane.business, key, &h.claimed, &ret);
        // Every member the return can belong to is taken as returned: a
        // duplicate is acceptable, a member deleted as delivered is lost.
        let mut found = false;
        for (h, outcome) in resolved.iter_mut() {
            if is_it(h) {
                *outcome = Outcome::Returned(reason.clone());
                found = true;
            }
        }
        for h in held.values_mut() {
            if h.published && is_it(h) {
                h.returned = Some(reason.clone());
                found = true;
            }
        }
        if !found {
            tracing::error!(
                reason = %reason,
                "a returned message matches no member awaiting a confirm"
            );
        }
    }
    for (mut h, outcome) in resolved {
        let outcome = match (h.returned.take(), outcome) {
            (_, Outcome::Returned(r)) => Outcome::Returned(r),
            (Some(r), Outcome::Ack | Outcome::Nack) => Outcome::Returned(r),
            (_, other) => other,
        };
        batch.add(h, outcome);
    }
}

/// What a confirm that failed with an error means for its member.
fn error_outcome(lane: &Lane, e: &lapin::Error, h: &Holding, batch: &Batch) -> Outcome {
    if let Some(reason) = topology_error(e) {
        // Nothing is wrong with the member: keep it pending, not dead.
        lane.pause.pause(&lane.business.name, &reason);
        return Outcome::Release;
    }
    match precondition_failure(e) {
        // The broker refused one message and closed the channel: every
        // confirm still owed on it fails with the same error, including
        // those of earlier messages whose confirms were not sent yet, and
        // they arrive in no particular order. Count an attempt only for
        // the refused message, so it ends in the dead set instead of
        // wedging the scanner; the others go back untouched.
        Some(reason) => match max_message_size(&reason) {
            // The error names the limit: blame exactly what exceeds it.
            Some(max) if h.claimed.body().len() > max => Outcome::Rejected(reason),
            Some(_) => Outcome::Release,
            // Otherwise one member per batch, so a message the broker
            // keeps refusing still runs out of attempts.
            None if !batch.has_rejected() => Outcome::Rejected(reason),
            None => Outcome::Release,
        },
        None => Outcome::Release,
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => futures::future::pending().await,
    }
}

/// What the broker's answer means for one member.
enum Outcome {
    /// Delivered: forget it.
    Ack,
    /// Refused for now: back after a backoff, no attempt counted.
    Nack,
    /// Unroutable: an attempt, then back with backoff or dead.
    Returned(String),
    /// Refused for good (too large, ...): an attempt, as for a return.
    Rejected(String),
    /// Never confirmed: back at its due time, no attempt counted.
    Release,
}

/// Members of one kind of outcome, grouped by the claim (tag) holding them.
#[derive(Default)]
struct Group {
    members: BTreeMap<u16, Vec<Arc<Claimed>>>,
    records: Vec<Arc<str>>,
    reason: String,
}

impl Group {
    fn push(&mut self, h: Holding) {
        self.members.entry(h.claim.tag).or_default().push(h.claimed);
        self.records.extend(h.claim.record.clone());
    }

    fn len(&self) -> usize {
        self.members.values().map(Vec::len).sum()
    }

    fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// Outcomes gathered for one round of Redis writes, and the claim records
/// still owed settles.
#[derive(Default)]
struct Batch {
    ack: Group,
    lateness: Vec<f64>,
    returned: Group,
    nacked: Group,
    rejected: Group,
    release: Group,
    /// Members of each claim record not settled in Redis yet.
    records: HashMap<Arc<str>, usize>,
    /// Records whose members are all settled: to delete.
    forget: Vec<String>,
}

impl Batch {
    fn has_rejected(&self) -> bool {
        !self.rejected.is_empty()
    }

    fn add(&mut self, h: Holding, outcome: Outcome) {
        match outcome {
            Outcome::Ack => {
                let now = h.claim.now_ms as f64 + h.claim.at.elapsed().as_secs_f64() * 1000.0;
                self.lateness
                    .push(((now - h.claimed.due_ms as f64) / 1000.0).max(0.0));
                self.ack.push(h);
            }
            Outcome::Nack => self.nacked.push(h),
            Outcome::Returned(r) => {
                self.returned.reason = r;
                self.returned.push(h);
            }
            Outcome::Rejected(r) => {
                self.rejected.reason = r;
                self.rejected.push(h);
            }
            Outcome::Release => self.release.push(h),
        }
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
    /// sweep deletes them once nothing needs them.
    fn keep(&mut self, records: &[Arc<str>]) {
        for r in records {
            self.records.remove(r);
        }
    }

    /// After a write that carried no record deletions: queue the records it
    /// completed for one HDEL, or keep them if it failed.
    fn written(&mut self, records: &[Arc<str>], ok: bool) {
        let done = self.count_down(records);
        if ok {
            self.forget.extend(done);
        } else {
            self.keep(records);
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

/// A channel closed because the exchange does not exist (404) or the user
/// may not publish to it (403): the topology, not the member, is at fault.
fn topology_error(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            let text = amqp.to_string();
            (text.contains("NOT_FOUND") || text.contains("ACCESS_REFUSED")).then_some(text)
        }
        _ => None,
    }
}

/// Publishing paused for a business because its exchange is missing or
/// forbidden; reported once on the log, a metric and `/readyz`.
#[derive(Default)]
pub struct Pause(std::sync::Mutex<Option<String>>);

impl Pause {
    /// True while publishing is paused.
    pub fn is_paused(&self) -> bool {
        self.0.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    fn pause(&self, business: &str, reason: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!(%reason, "the broker refused the exchange (missing or forbidden); members stay pending and publishing resumes once it is back");
            METRICS.paused.with_label_values(&[business]).set(1);
            crate::telemetry::set_paused(business, Some(reason));
        }
        *g = Some(reason.to_string());
    }

    fn resume(&self, business: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.take().is_some() {
            tracing::info!("the exchange answers again; publishing resumes");
            METRICS.paused.with_label_values(&[business]).set(0);
            crate::telemetry::set_paused(business, None);
        }
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
                if e.is_wrong_type() {
                    // Only a producer can fix the key; the members stay in
                    // flight (nothing was written) and are recovered later.
                    if Instant::now() > give_up {
                        return None;
                    }
                } else {
                    lane.redis.down(&e);
                    if Instant::now() > give_up {
                        return None;
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

fn held_refs(g: &Group) -> Vec<Held<&Claimed>> {
    g.members
        .iter()
        .map(|(tag, ms)| (*tag, ms.iter().map(|c| c.as_ref()).collect()))
        .collect()
}

/// Writes a batch of outcomes to Redis, retrying while Redis is away: an ack
/// that is not written becomes a duplicate once the lease expires. Every
/// write names the claim holding its members, so a retry after a lost reply
/// changes nothing the first run did not.
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
        let group = std::mem::take(&mut batch.ack);
        let done = batch.count_down(&group.records);
        let groups: Vec<Held<&[u8]>> = group
            .members
            .iter()
            .map(|(tag, ms)| (*tag, ms.iter().map(|c| c.member.as_slice()).collect()))
            .collect();
        let ok = until_written(lane, give_up, &mut backoff, || {
            lane.store.ack(&groups, &done)
        })
        .await
        .is_some();
        if !ok {
            tracing::error!(members = group.len(), "could not record confirms in Redis in time; these members will be recovered and published again");
            batch.keep(&group.records);
        }
        METRICS
            .confirmed
            .with_label_values(&[&b.name])
            .inc_by(group.len() as u64);
        let h = METRICS.lateness.with_label_values(&[&b.name]);
        for l in &batch.lateness {
            h.observe(*l);
        }
        batch.lateness.clear();
    }
    let groups = [
        (
            std::mem::take(&mut batch.returned),
            Back::Refused,
            "returned",
        ),
        (
            std::mem::take(&mut batch.rejected),
            Back::Refused,
            "rejected",
        ),
        (std::mem::take(&mut batch.nacked), Back::Nack, "nacked"),
        (
            std::mem::take(&mut batch.release),
            Back::Release,
            "released",
        ),
    ];
    for (group, mode, kind) in groups {
        if group.is_empty() {
            continue;
        }
        let n = group.len() as u64;
        match kind {
            "returned" => METRICS.returned.with_label_values(&[&b.name]).inc_by(n),
            "nacked" => METRICS.nacked.with_label_values(&[&b.name]).inc_by(n),
            _ => {}
        }
        let reason = match kind {
            "nacked" => "nacked by the broker (a queue refused it for now)".to_string(),
            "released" => "not confirmed".to_string(),
            _ => group.reason.clone(),
        };
        let policy = BackPolicy {
            reason: &reason,
            max_attempts: b.max_attempts,
            backoff: b.retry_backoff,
            backoff_max: b.retry_backoff_max,
        };
        let refs = held_refs(&group);
        let out = until_written(lane, give_up, &mut backoff, || {
            lane.store.back(mode, &refs, &policy)
        })
        .await;
        batch.written(&group.records, out.is_some());
        let Some(out) = out else {
            tracing::error!(members = n, reason = %reason, "could not hand members back in Redis in time; they stay in flight and are recovered after their lease");
            continue;
        };
        let max_attempt = group
            .members
            .values()
            .flatten()
            .map(|c| c.attempt)
            .max()
            .unwrap_or(0);
        match mode {
            Back::Release => {
                METRICS
                    .released
                    .with_label_values(&[&b.name])
                    .inc_by(out.back);
            }
            Back::Nack if out.back > 0 => {
                METRICS
                    .retried
                    .with_label_values(&[&b.name, kind])
                    .inc_by(out.back);
                tracing::warn!(
                    members = out.back,
                    exchange = %b.exchange,
                    routing_key = %b.routing_key,
                    "the broker nacked publishes (a queue at its length limit, or without a leader); kept pending, retried after {:?}, no attempt counted",
                    b.retry_backoff
                );
            }
            Back::Refused if out.back > 0 => {
                METRICS
                    .retried
                    .with_label_values(&[&b.name, kind])
                    .inc_by(out.back);
                tracing::warn!(
                    reason = %reason,
                    members = out.back,
                    attempt = max_attempt,
                    exchange = %b.exchange,
                    routing_key = %b.routing_key,
                    "publish not delivered; rescheduled with backoff"
                );
            }
            _ => {}
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
    // Claims completed by hand-backs (rare): their records go in one more
    // call.
    if !batch.forget.is_empty() {
        let forget = std::mem::take(&mut batch.forget);
        if until_written(lane, give_up, &mut backoff, || lane.store.forget(&forget))
            .await
            .is_none()
        {
            // Only the record (a few KB) stays behind; the sweep deletes it.
            tracing::warn!(
                records = forget.len(),
                "could not delete settled claim records in time"
            );
        }
    }
}

/// How often a key's stale retry state and orphaned claim records are
/// swept: once per lease, between 1 s and 30 s. A record is only swept once
/// it is older than a lease, so sweeping more often would find nothing new.
pub fn sweep_interval(lease: Duration) -> Duration {
    lease.clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Id mode: the longest a pass over a key's body hash takes, and so about
/// how long an orphaned body (a producer's bare `ZREM` cancel) can outlive
/// its id. Each sweep looks at the share of the hash that keeps a pass
/// within this, at least 2000 fields: the cost is spread evenly, whatever
/// the size, and never falls on a claim.
pub const BODY_PASS: Duration = Duration::from_secs(600);

/// Sweeps one key every [`sweep_interval`] until `stop`: cancelled members'
/// retry state, claim records whose settle write was lost and, in id mode,
/// orphaned bodies. An idle key costs one cheap script call per interval.
pub async fn sweep(lane: Arc<Lane>, stop: CancellationToken) {
    let every = sweep_interval(lane.business.lease);
    let (mut body_cursor, mut body_len) = ("0".to_string(), 0u64);
    let (mut meta_cursor, mut meta_len) = ("0".to_string(), 0u64);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Like the bodies, a pass over the retry state is spread over the
        // sweeps of BODY_PASS, at least 2000 entries per sweep.
        let share = (meta_len as u128 * every.as_millis() / BODY_PASS.as_millis()) as u64;
        let lease = lane.business.lease;
        match lane
            .store
            .sweep_slice(&meta_cursor, share.max(2000), lease)
            .await
        {
            Ok((next, out, len)) => {
                if out.meta + out.records > 0 {
                    tracing::debug!(
                        business = %lane.business.name,
                        key = %lane.store.keys().pending,
                        stale_meta = out.meta,
                        orphan_records = out.records,
                        "swept state nothing needs any more"
                    );
                }
                meta_cursor = next;
                meta_len = len;
            }
            Err(e) => tracing::debug!(error = %e, "sweep failed; trying again next interval"),
        }
        let share = (body_len as u128 * every.as_millis() / BODY_PASS.as_millis()) as u64;
        match lane.store.sweep_bodies(&body_cursor, share.max(2000)).await {
            Ok((next, deleted, len)) => {
                if deleted > 0 {
                    tracing::debug!(
                        business = %lane.business.name,
                        key = %lane.store.keys().pending,
                        orphan_bodies = deleted,
                        "swept bodies whose id was cancelled"
                    );
                }
                body_cursor = next;
                body_len = len;
            }
            Err(e) => tracing::debug!(error = %e, "body sweep failed; trying again next interval"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `n` publishes, one going out every `every`.
    async fn trickle(n: u64, every: Duration, progress: &AtomicU64) -> u64 {
        for _ in 0..n {
            tokio::time::sleep(every).await;
            progress.fetch_add(1, Ordering::Relaxed);
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_keeps_moving_is_never_declared_stalled() {
        let progress = AtomicU64::new(0);
        let stop = CancellationToken::new();
        let deadline = tokio::sync::OnceCell::new();
        // 90 s in all, far past PUBLISH_STALL, but a publish every 5 s.
        let batch = trickle(18, Duration::from_secs(5), &progress);
        let out = publish_or_give_up(batch, &progress, || false, &stop, &deadline).await;
        assert!(
            matches!(out, Published::All(18)),
            "a moving batch was given up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_stops_moving_is_declared_stalled_after_the_bound() {
        let progress = AtomicU64::new(0);
        let stop = CancellationToken::new();
        let deadline = tokio::sync::OnceCell::new();
        let start = tokio::time::Instant::now();
        let batch = async {
            trickle(3, Duration::from_secs(5), &progress).await;
            std::future::pending::<u64>().await
        };
        let out = publish_or_give_up(batch, &progress, || false, &stop, &deadline).await;
        assert!(matches!(out, Published::Stalled));
        // The last publish went out at 15 s; nothing moved for 30 s after.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(45) && waited <= Duration::from_secs(61),
            "{waited:?}"
        );
    }
}
