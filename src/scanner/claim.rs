//! The claim-and-publish loop of one scanner: wait for due members (or a
//! wake-up), take a rate budget, claim a batch, publish it, and hand every
//! claimed member to the settler.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) async fn scan(
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
pub(super) const PUBLISH_STALL: Duration = Duration::from_secs(30);

/// How handing a batch to lapin ended.
pub(super) enum Published<T> {
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
pub(super) async fn publish_or_give_up<F: std::future::Future>(
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
pub(super) fn give_back(lane: &Lane, granted: Option<usize>, used: usize) {
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
pub(super) async fn idle(
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
pub(super) const WAKE_GAP: Duration = Duration::from_millis(5);

/// The leader's sleep until `deadline`. A wake-up hint (a producer's write,
/// or a scanner that left work behind) costs a look at the earliest pending
/// member, not a claim, and at most one look per [`WAKE_GAP`]: a write due
/// next week only confirms the deadline, a write due sooner moves it, and
/// one due now ends the sleep.
pub(super) async fn lead_idle(
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
