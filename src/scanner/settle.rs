//! The settler: reads the broker's answers for published batches, extends
//! the leases of what it holds, and settles each member in Redis.

use super::*;
use lapin::message::BasicReturnMessage;

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
    let mut owed = Owed::default();
    let mut open = true;
    let lease_check = (b.lease / 3).max(Duration::from_millis(100));
    let mut extend_tick = tokio::time::interval(lease_check);
    extend_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Batch::default();

    loop {
        if !open && owed.held.is_empty() {
            break;
        }
        let deadline = drain_deadline.get().copied();
        tokio::select! {
            biased;
            // First, so a steady stream of confirms cannot starve it.
            _ = extend_tick.tick() => {
                extend(&lane, &owed.held, lease_check).await;
            }
            _ = sleep_until_opt(deadline) => {
                if open {
                    // The scanner hands back what it still publishes.
                    while let Ok(msg) = rx.try_recv() {
                        owed.take(&mut batch, msg);
                    }
                }
                settle_at_deadline(&lane, &mut owed, &mut batch).await;
                break;
            }
            msg = rx.recv(), if open => match msg {
                Some(ToSettle::Unpublished(seqs)) => {
                    let n = seqs.len();
                    owed.take(&mut batch, ToSettle::Unpublished(seqs));
                    flush(&lane, &mut batch, deadline).await;
                    window.add_permits(n);
                }
                Some(msg) => owed.take(&mut batch, msg),
                None => open = false,
            },
            Some(first) = owed.confirms.next(), if !owed.confirms.is_empty() => {
                let ready = owed.gather(Some(first));
                // What the scanner claimed before these resolved: a return
                // they carry may be of a member it is still publishing.
                while let Ok(msg) = rx.try_recv() {
                    let n = match &msg {
                        ToSettle::Unpublished(seqs) => seqs.len(),
                        _ => 0,
                    };
                    owed.take(&mut batch, msg);
                    window.add_permits(n);
                }
                let done = ready.len();
                settle_confirms(&lane, &mut owed.held, &mut batch, ready);
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
pub(super) async fn settle_at_deadline(lane: &Lane, owed: &mut Owed, batch: &mut Batch) {
    owed.settle_ready(lane, batch);
    flush(lane, batch, Some(tokio::time::Instant::now())).await;
    // Confirms that came in while those writes waited.
    owed.settle_ready(lane, batch);
    flush(lane, batch, Some(tokio::time::Instant::now())).await;
    let held = &mut owed.held;
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

pub(super) type Confirms =
    FuturesUnordered<futures::future::BoxFuture<'static, (u64, lapin::Result<Confirmation>)>>;

/// A confirm that has resolved, with the member's sequence number.
pub(super) type Resolved = (u64, lapin::Result<Confirmation>);

/// What the settler holds: every member from its claim until it is
/// settled, the confirms the broker owes, and the channels they are owed on.
#[derive(Default)]
pub(super) struct Owed {
    pub(super) held: HashMap<u64, Holding>,
    pub(super) confirms: Confirms,
    /// By channel id; a reopened channel replaces the one it succeeds.
    channels: HashMap<u16, Channel>,
}

impl Owed {
    /// Takes one message from the scanner into the settler's state.
    pub(super) fn take(&mut self, batch: &mut Batch, msg: ToSettle) {
        match msg {
            ToSettle::Claimed(claim, members, slots) => {
                if let Some(r) = &claim.record {
                    batch.records.insert(r.clone(), members.len());
                }
                let mut slots = slots.into_iter();
                for (seq, claimed) in members {
                    self.held.insert(
                        seq,
                        Holding {
                            claimed,
                            claim: claim.clone(),
                            published: None,
                            returned: None,
                            _slot: slots.next().flatten(),
                        },
                    );
                }
            }
            ToSettle::Published(confirms, channel) => {
                let id = channel.id();
                for (seq, confirm) in confirms {
                    if let Some(h) = self.held.get_mut(&seq) {
                        h.published = Some(id);
                        self.confirms
                            .push(Box::pin(async move { (seq, confirm.await) }));
                    }
                }
                self.channels.insert(id, channel);
            }
            ToSettle::Unpublished(seqs) => {
                for seq in seqs {
                    if let Some(h) = self.held.remove(&seq) {
                        batch.add(h, Outcome::Release);
                    }
                }
            }
        }
    }

    /// Every confirm resolved so far (`first` among them), gathered so that
    /// a return is always seen with the ack of the member it carries.
    ///
    /// The broker sends a message's `basic.return` before its ack, but
    /// lapin pins each waiting return on whichever confirm it completes
    /// next, and completes the tags of one `multiple` ack in no fixed order:
    /// the confirm carrying a member's return may resolve just after the
    /// member's own ack. So after each round of resolved confirms, wait
    /// until lapin has finished the confirm frames being handled on their
    /// channels ([`amqp::confirm_frames_done`]) and take what those
    /// resolved too; stop when a round brings nothing new. That ends, as
    /// the window bounds the confirms owed and nothing more is published
    /// until this returns.
    pub(super) fn gather(&mut self, first: Option<Resolved>) -> Vec<Resolved> {
        let (held, channels) = (&self.held, &self.channels);
        let channel_of = |seq: &u64| held.get(seq).and_then(|h| h.published);
        let frames_done = |id: u16| {
            if let Some(ch) = channels.get(&id) {
                amqp::confirm_frames_done(ch);
            }
        };
        let ready = gather(&mut self.confirms, first, channel_of, frames_done);
        self.forget_idle_channels();
        ready
    }

    /// Settles every confirm that has already resolved.
    pub(super) fn settle_ready(&mut self, lane: &Lane, batch: &mut Batch) {
        let ready = self.gather(None);
        if !ready.is_empty() {
            settle_confirms(lane, &mut self.held, batch, ready);
        }
    }

    /// Drops channels no held member awaits a confirm on, so a closed
    /// channel is not kept alive by the settler.
    fn forget_idle_channels(&mut self) {
        if self.channels.len() > 1 {
            let used: Vec<u16> = self.held.values().filter_map(|h| h.published).collect();
            self.channels.retain(|id, _| used.contains(id));
        }
    }
}

/// [`Owed::gather`], over any confirms: `channel_of` names the channel a
/// member was published on, `frames_done` waits until the confirm frames
/// being handled on one have been.
fn gather(
    confirms: &mut Confirms,
    first: Option<Resolved>,
    channel_of: impl Fn(&u64) -> Option<u16>,
    mut frames_done: impl FnMut(u16),
) -> Vec<Resolved> {
    let mut ready: Vec<Resolved> = first.into_iter().collect();
    let mut seen = 0;
    drain_resolved(confirms, &mut ready);
    while seen < ready.len() {
        let mut done = Vec::new();
        for (seq, _) in &ready[seen..] {
            if let Some(id) = channel_of(seq).filter(|id| !done.contains(id)) {
                done.push(id);
                frames_done(id);
            }
        }
        seen = ready.len();
        drain_resolved(confirms, &mut ready);
    }
    ready
}

/// Moves every confirm that has resolved into `ready`.
fn drain_resolved(confirms: &mut Confirms, ready: &mut Vec<Resolved>) {
    while let Some(Some(r)) = confirms.next().now_or_never() {
        ready.push(r);
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
    ready: Vec<Resolved>,
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
    let key = &lane.store.keys().pending;
    let is_it = |h: &Holding, ret: &BasicReturnMessage| {
        message::is_return_of(&lane.business, key, &h.claimed, ret)
    };
    match_returns(&returns, &mut resolved, held, is_it);
    for (mut h, outcome) in resolved {
        let outcome = match (h.returned.take(), outcome) {
            (_, Outcome::Returned(r)) => Outcome::Returned(r),
            (Some(r), Outcome::Ack | Outcome::Nack) => Outcome::Returned(r),
            (_, other) => other,
        };
        batch.add(h, outcome);
    }
}

/// Marks every member a return can belong to as returned: those resolved
/// now, and every member still held, published or not, since a member's
/// return may ride an earlier batch's confirm while the scanner is still
/// sending its own batch (before the settler knows it was published). A
/// false match costs a duplicate; a member deleted as delivered is lost.
fn match_returns(
    returns: &[BasicReturnMessage],
    resolved: &mut [(Holding, Outcome)],
    held: &mut HashMap<u64, Holding>,
    is_it: impl Fn(&Holding, &BasicReturnMessage) -> bool,
) {
    for ret in returns {
        let reason = format!(
            "returned as unroutable ({} {})",
            ret.reply_code,
            ret.reply_text.as_str()
        );
        let mut found = false;
        for (h, outcome) in resolved.iter_mut() {
            if is_it(h, ret) {
                *outcome = Outcome::Returned(reason.clone());
                found = true;
            }
        }
        for h in held.values_mut() {
            if is_it(h, ret) {
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
}

pub(super) async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::message::{BasicReturnMessage, Delivery};

    fn returned(body: &[u8]) -> BasicReturnMessage {
        BasicReturnMessage {
            delivery: Delivery::mock(0, "ex".into(), "rk".into(), false, body.to_vec()),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    fn holding(body: &[u8], published: Option<u16>) -> Holding {
        Holding {
            claimed: Arc::new(Claimed {
                member: body.to_vec(),
                due_ms: 0,
                attempt: 1,
                body: None,
                tenant: None,
            }),
            claim: Arc::new(ClaimInfo {
                tag: 1,
                record: None,
                now_ms: 0,
                at: Instant::now(),
            }),
            published,
            returned: None,
            _slot: None,
        }
    }

    /// Member 2's frames went out while its batch was still being sent, so
    /// the settler had not yet taken it as published when its return rode
    /// member 1's confirm: it is marked returned all the same, and its own
    /// ack, coming next, cannot settle it as delivered.
    #[test]
    fn a_return_riding_an_earlier_confirm_marks_a_member_not_yet_taken_as_published() {
        let mut held = HashMap::new();
        held.insert(2, holding(b"member-2", None));
        let mut resolved = vec![(holding(b"member-1", Some(7)), Outcome::Ack)];
        let is_it =
            |h: &Holding, r: &BasicReturnMessage| h.claimed.body() == r.delivery.data.as_slice();
        match_returns(&[returned(b"member-2")], &mut resolved, &mut held, is_it);
        assert!(
            matches!(resolved[0].1, Outcome::Ack),
            "member 1 is delivered"
        );
        assert!(
            held[&2].returned.is_some(),
            "member 2's return was dropped as matching no member"
        );
    }

    /// lapin completed member 1's ack first, and the confirm carrying
    /// member 1's return (member 2's, in the same `multiple` ack) only once
    /// it finished that frame: the two are gathered together, so the
    /// return is seen before member 1 could be settled as delivered.
    #[tokio::test]
    async fn a_confirm_carrying_a_return_that_resolves_after_its_members_ack_is_gathered_with_it() {
        let mut confirms = Confirms::new();
        confirms.push(Box::pin(async { (1, Ok(Confirmation::Ack(None))) }));
        let (frame_done, carrier) = futures::channel::oneshot::channel::<()>();
        confirms.push(Box::pin(async move {
            let _ = carrier.await;
            (2, Ok(Confirmation::Ack(Some(returned(b"member-1")))))
        }));
        let first = confirms.next().await;
        assert_eq!(first.as_ref().map(|r| r.0), Some(1));
        let mut frame_done = Some(frame_done);
        let ready = gather(
            &mut confirms,
            first,
            |_| Some(7),
            |id| {
                assert_eq!(id, 7);
                if let Some(tx) = frame_done.take() {
                    let _ = tx.send(());
                }
            },
        );
        let seqs: Vec<u64> = ready.iter().map(|r| r.0).collect();
        assert_eq!(seqs, vec![1, 2], "the carrier is gathered with the ack");
        assert!(confirms.is_empty());
    }
}
