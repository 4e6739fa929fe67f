//! The settler: reads the broker's answers for published batches, extends
//! the leases of what it holds, and settles each member in Redis.

use super::*;

/// Settles claimed members by their confirms, in batches: everything that
/// has resolved by the time the previous batch is written goes in the next.
/// It holds every member from its claim until it is settled, extends their
/// leases while they wait, and at the stop deadline hands back the rest.
pub(super) async fn settle(
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
pub(super) async fn settle_at_deadline(
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
pub(super) fn settle_ready(
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

pub(super) type Confirms =
    FuturesUnordered<futures::future::BoxFuture<'static, (u64, lapin::Result<Confirmation>)>>;

/// Takes one message from the scanner into the settler's state.
pub(super) fn take(
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
pub(super) async fn extend(lane: &Lane, held: &HashMap<u64, Holding>, older_than: Duration) {
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
pub(super) fn settle_confirms(
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

pub(super) async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => futures::future::pending().await,
    }
}
