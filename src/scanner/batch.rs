//! A published batch and its groups, and `flush`: the Redis writes that
//! settle them, each retried until written or the stop's deadline.

use super::*;

/// Members of one kind of outcome, grouped by the claim (tag) holding them.
#[derive(Default)]
pub(super) struct Group {
    pub(super) members: BTreeMap<u16, Vec<Arc<Claimed>>>,
    pub(super) records: Vec<Arc<str>>,
    pub(super) reason: String,
}

impl Group {
    pub(super) fn push(&mut self, h: Holding) {
        self.members.entry(h.claim.tag).or_default().push(h.claimed);
        self.records.extend(h.claim.record.clone());
    }

    pub(super) fn len(&self) -> usize {
        self.members.values().map(Vec::len).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// Outcomes gathered for one round of Redis writes, and the claim records
/// still owed settles.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) ack: Group,
    pub(super) lateness: Vec<f64>,
    pub(super) returned: Group,
    pub(super) nacked: Group,
    pub(super) rejected: Group,
    pub(super) release: Group,
    /// Members of each claim record not settled in Redis yet.
    pub(super) records: HashMap<Arc<str>, usize>,
    /// Records whose members are all settled: to delete.
    pub(super) forget: Vec<String>,
}

impl Batch {
    pub(super) fn has_rejected(&self) -> bool {
        !self.rejected.is_empty()
    }

    pub(super) fn add(&mut self, h: Holding, outcome: Outcome) {
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
    pub(super) fn count_down(&mut self, records: &[Arc<str>]) -> Vec<String> {
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
    pub(super) fn keep(&mut self, records: &[Arc<str>]) {
        for r in records {
            self.records.remove(r);
        }
    }

    /// After a write that carried no record deletions: queue the records it
    /// completed for one HDEL, or keep them if it failed.
    pub(super) fn written(&mut self, records: &[Arc<str>], ok: bool) {
        let done = self.count_down(records);
        if ok {
            self.forget.extend(done);
        } else {
            self.keep(records);
        }
    }
}

/// Runs one Redis write until it succeeds, or `None` once `give_up` passes.
pub(super) async fn until_written<T, F, Fut>(
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

pub(super) fn held_refs(g: &Group) -> Vec<Held<&Claimed>> {
    g.members
        .iter()
        .map(|(tag, ms)| (*tag, ms.iter().map(|c| c.as_ref()).collect()))
        .collect()
}

/// Why members go back from a batch, with what each way back implies: the
/// store's mode, the label metrics and logs use, its counter and reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandBack {
    /// Returned unroutable: an attempt, retried with backoff, then dead.
    Returned,
    /// Refused for good (the channel closed over it): as a return.
    Rejected,
    /// Nacked: the broker's overload, retried after `retry_backoff`.
    Nacked,
    /// Never confirmed: back at its due time, no attempt counted.
    Released,
}

impl HandBack {
    fn mode(self) -> Back {
        match self {
            HandBack::Returned | HandBack::Rejected => Back::Refused,
            HandBack::Nacked => Back::Nack,
            HandBack::Released => Back::Release,
        }
    }

    /// The `reason` label of `delayd_retried_total` and
    /// `delayd_dead_lettered_total`.
    fn label(self) -> &'static str {
        match self {
            HandBack::Returned => "returned",
            HandBack::Rejected => "rejected",
            HandBack::Nacked => "nacked",
            HandBack::Released => "released",
        }
    }

    /// What the dead set records: the broker's own words for a refusal.
    fn reason(self, group: &Group) -> String {
        match self {
            HandBack::Nacked => "nacked by the broker (a queue refused it for now)".to_string(),
            HandBack::Released => "not confirmed".to_string(),
            HandBack::Returned | HandBack::Rejected => group.reason.clone(),
        }
    }

    /// The counter of members that went back this way, when it has one.
    fn counter(self) -> Option<&'static prometheus::IntCounterVec> {
        match self {
            HandBack::Returned => Some(&METRICS.returned),
            HandBack::Nacked => Some(&METRICS.nacked),
            HandBack::Rejected | HandBack::Released => None,
        }
    }
}

/// Writes what a batch's answers decided: the confirmed members acked, the
/// others handed back by kind, and the records of completed claims deleted.
/// Each write is retried while the lease protects its members, never past
/// a stop's deadline: what is not written then is recovered later.
pub(super) async fn flush(
    lane: &Lane,
    batch: &mut Batch,
    drain_deadline: Option<tokio::time::Instant>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut give_up = Instant::now() + lane.business.lease;
    if let Some(d) = drain_deadline {
        give_up = give_up.min(d.into_std() + Duration::from_secs(1));
    }
    flush_acks(lane, batch, give_up, &mut backoff).await;
    let groups = [
        (std::mem::take(&mut batch.returned), HandBack::Returned),
        (std::mem::take(&mut batch.rejected), HandBack::Rejected),
        (std::mem::take(&mut batch.nacked), HandBack::Nacked),
        (std::mem::take(&mut batch.release), HandBack::Released),
    ];
    for (group, kind) in groups {
        if !group.is_empty() {
            hand_back(lane, batch, group, kind, give_up, &mut backoff).await;
        }
    }
    forget_records(lane, batch, give_up, &mut backoff).await;
}

/// Acks the confirmed members, and records their lateness.
async fn flush_acks(lane: &Lane, batch: &mut Batch, give_up: Instant, backoff: &mut Backoff) {
    if batch.ack.is_empty() {
        return;
    }
    let b = &lane.business;
    let group = std::mem::take(&mut batch.ack);
    let done = batch.count_down(&group.records);
    let groups: Vec<Held<&Claimed>> = group
        .members
        .iter()
        .map(|(tag, ms)| (*tag, ms.iter().map(|c| &**c).collect()))
        .collect();
    let ok = until_written(lane, give_up, backoff, || lane.store.ack(&groups, &done))
        .await
        .is_some();
    if !ok {
        tracing::error!(members = group.len(), "could not record confirms in Redis in time; these members will be recovered and published again");
        batch.keep(&group.records);
    }
    add_to(&METRICS.confirmed, &[&b.name], group.len() as u64);
    let h = METRICS.lateness.with_label_values(&[&b.name]);
    for l in &batch.lateness {
        h.observe(*l);
    }
    batch.lateness.clear();
}

/// Hands one group back to pending (or the dead set) and reports it.
async fn hand_back(
    lane: &Lane,
    batch: &mut Batch,
    group: Group,
    kind: HandBack,
    give_up: Instant,
    backoff: &mut Backoff,
) {
    let b = &lane.business;
    let n = group.len() as u64;
    if let Some(c) = kind.counter() {
        c.with_label_values(&[&b.name]).inc_by(n);
    }
    let reason = kind.reason(&group);
    let policy = BackPolicy {
        reason: &reason,
        max_attempts: b.max_attempts,
        backoff: b.retry_backoff,
        backoff_max: b.retry_backoff_max,
    };
    let refs = held_refs(&group);
    let out = until_written(lane, give_up, backoff, || {
        lane.store.back(kind.mode(), &refs, &policy)
    })
    .await;
    batch.written(&group.records, out.is_some());
    let Some(out) = out else {
        tracing::error!(members = n, reason = %reason, "could not hand members back in Redis in time; they stay in flight and are recovered after their lease");
        return;
    };
    let max_attempt = group
        .members
        .values()
        .flatten()
        .map(|c| c.attempt)
        .max()
        .unwrap_or(0);
    report_hand_back(b, kind, &reason, &out, max_attempt);
}

/// The metrics and log lines of one hand-back.
fn report_hand_back(
    b: &Business,
    kind: HandBack,
    reason: &str,
    out: &crate::store::BackOutcome,
    max_attempt: u32,
) {
    match kind.mode() {
        Back::Release => {
            add_to(&METRICS.released, &[&b.name], out.back);
        }
        Back::Nack if out.back > 0 => {
            add_to(&METRICS.retried, &[&b.name, kind.label()], out.back);
            tracing::warn!(
                members = out.back,
                exchange = %b.exchange,
                routing_key = %b.routing_key,
                "the broker nacked publishes (a queue at its length limit, or without a leader); kept pending, retried after {:?}, no attempt counted",
                b.retry_backoff
            );
        }
        Back::Refused if out.back > 0 => {
            add_to(&METRICS.retried, &[&b.name, kind.label()], out.back);
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
        count_dead(b, kind.label(), out.dead);
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

/// Deletes the records of claims completed by hand-backs (rare), in one
/// more call.
async fn forget_records(lane: &Lane, batch: &mut Batch, give_up: Instant, backoff: &mut Backoff) {
    if batch.forget.is_empty() {
        return;
    }
    let forget = std::mem::take(&mut batch.forget);
    if until_written(lane, give_up, backoff, || lane.store.forget(&forget))
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
