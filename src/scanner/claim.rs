//! The claim-and-publish loop of one scanner: wait for due members (or a
//! wake-up), take a rate budget, claim a batch, publish it, and hand every
//! claimed member to the settler.

use super::*;

/// Why a turn of the loop ended early, and what comes next.
pub(super) enum Next {
    /// Start the next turn at once.
    Again,
    /// Sleep this long (or until the stop), then start the next turn.
    RetryAfter(Duration),
    /// The scanner is done.
    Stop,
}

/// A step of a turn: its result, or how the turn ends.
type Step<T> = Result<T, Next>;

/// One scanner's loop and what it keeps between turns.
pub(super) struct Scanner<'a> {
    pub lane: &'a Lane,
    pub index: usize,
    pub broker: &'a Broker,
    pub stop: &'a CancellationToken,
    pub window: &'a Arc<Semaphore>,
    pub tx: &'a mpsc::UnboundedSender<ToSettle>,
    pub drain_deadline: &'a tokio::sync::OnceCell<tokio::time::Instant>,
    channel: Option<Channel>,
    /// Set by a failed publish: the next turn opens a new channel. The old
    /// one is kept until then, so a stop during the back-off still lets the
    /// settler receive the confirms it owes.
    reopen: bool,
    /// Set once the pause has been waited on: the next turn asks the broker.
    pause_waited: bool,
    redis_backoff: Backoff,
    amqp_backoff: Backoff,
    topology_backoff: Backoff,
    channel_error_logged: bool,
    wrong_type_logged: bool,
    seq: u64,
    /// The express scanner of a business with tenants: it claims only for
    /// tenants newly due, while the others work through a backlog.
    pub express: bool,
    /// The express scanner looks again at once, without a wake-up: its
    /// last claim moved members, and more may be newly due.
    pub look_now: bool,
    /// How many tenants the express scanner's last look found newly due.
    pub fresh: usize,
}

impl<'a> Scanner<'a> {
    /// A scanner of `lane` that hands what it claims to `tx`.
    pub fn new(
        lane: &'a Lane,
        index: usize,
        broker: &'a Broker,
        stop: &'a CancellationToken,
        window: &'a Arc<Semaphore>,
        tx: &'a mpsc::UnboundedSender<ToSettle>,
        drain_deadline: &'a tokio::sync::OnceCell<tokio::time::Instant>,
    ) -> Self {
        Scanner {
            lane,
            index,
            broker,
            stop,
            window,
            tx,
            drain_deadline,
            channel: None,
            reopen: false,
            pause_waited: false,
            redis_backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
            amqp_backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            topology_backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            channel_error_logged: false,
            wrong_type_logged: false,
            seq: 0,
            express: lane.fair.is_some() && index == lane.business.scanners,
            look_now: false,
            fresh: 0,
        }
    }

    /// Runs turns until the stop; the one place the loop sleeps. Returns the
    /// channel, which must outlive the settler.
    pub async fn run(mut self) -> Option<Channel> {
        while !self.stop.is_cancelled() {
            match self.turn().await {
                Ok(()) | Err(Next::Again) => {}
                Err(Next::Stop) => break,
                Err(Next::RetryAfter(d)) => {
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(d) => {}
                    }
                }
            }
        }
        self.channel
    }

    /// One turn: claim a batch and publish it, as a list of steps.
    async fn turn(&mut self) -> Step<()> {
        self.wait_for_broker().await?;
        self.wait_out_pause().await?;
        if self.express {
            // Its channel is open before the wait, so a claim after it
            // costs no round trip of the broker's.
            self.open_channel().await?;
            self.wait_fresh().await?;
        }
        let ch = self.open_channel().await?;
        let want = self.window_slots().await?;
        let (want, granted) = self.rate_budget(want).await?;
        let (now_ms, members) = self.claim(want, granted).await?;
        self.publish(&ch, now_ms, members).await
    }

    /// A blocked broker is waited out here, not mid-batch.
    async fn wait_for_broker(&self) -> Step<()> {
        if self.broker.is_blocked() && self.broker.ready(self.stop).await.is_none() {
            return Err(Next::Stop);
        }
        Ok(())
    }

    /// The exchange is gone or publishing is forbidden: claiming would only
    /// hand members back at round-trip speed. Wait, with backoff, until the
    /// exchange answers a passive declare again.
    async fn wait_out_pause(&mut self) -> Step<()> {
        if !self.lane.pause.is_paused() {
            return Ok(());
        }
        if !std::mem::take(&mut self.pause_waited) {
            self.pause_waited = true;
            return Err(Next::RetryAfter(self.topology_backoff.next_delay()));
        }
        let Some(conn) = self.broker.ready(self.stop).await else {
            return Err(Next::Stop);
        };
        match amqp::exchange_exists(&conn, &self.lane.business.exchange).await {
            Ok(()) => {
                self.lane.pause.resume(&self.lane.business.name);
                self.topology_backoff.reset();
                self.channel = None;
                Ok(())
            }
            Err(_) => {
                self.pause_waited = true;
                Err(Next::RetryAfter(self.topology_backoff.next_delay()))
            }
        }
    }

    /// The scanner's channel, opened again when it broke.
    async fn open_channel(&mut self) -> Step<Channel> {
        if std::mem::take(&mut self.reopen) {
            self.channel = None;
        }
        if let Some(c) = self.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        self.channel = None;
        match self.broker.channel(self.stop).await {
            None => Err(Next::Stop),
            Some(Ok(c)) => {
                if self.channel_error_logged {
                    tracing::info!("channel open again; publishing resumes");
                }
                self.channel_error_logged = false;
                self.channel = Some(c.clone());
                Ok(c)
            }
            Some(Err(e)) => {
                if !self.channel_error_logged && self.broker.health.is_up() {
                    tracing::warn!(error = %e, "cannot open a channel; retrying");
                    self.channel_error_logged = true;
                }
                Err(Next::RetryAfter(self.amqp_backoff.next_delay()))
            }
        }
    }

    /// Takes as many window slots as are free, up to a batch, waiting for one.
    async fn window_slots(&self) -> Step<usize> {
        let first = tokio::select! {
            _ = self.stop.cancelled() => return Err(Next::Stop),
            p = self.window.clone().acquire_owned() => p.map_err(|_| Next::Stop)?,
        };
        first.forget();
        let most = match self.express {
            // One member for each tenant newly due.
            true => self.fresh.clamp(1, self.lane.business.batch_size),
            false => self.lane.business.batch_size,
        };
        let mut want = 1usize;
        while want < most {
            match self.window.try_acquire() {
                Ok(p) => {
                    p.forget();
                    want += 1;
                }
                Err(_) => break,
            }
        }
        Ok(want)
    }

    /// Fits `want` to the business's publish-rate budget, when it has one.
    /// Returns how many to claim and the tokens granted for them (the ones
    /// the claim does not use go back).
    async fn rate_budget(&mut self, mut want: usize) -> Step<(usize, Option<usize>)> {
        let Some((limiter, burst)) = &self.lane.limiter else {
            return Ok((want, None));
        };
        if want > *burst {
            self.window.add_permits(want - *burst);
            want = *burst;
        }
        let take = tokio::select! {
            _ = self.stop.cancelled() => None,
            t = limiter.take(want, *burst) => Some(t),
        };
        match take {
            None => {
                self.window.add_permits(want);
                Err(Next::Stop)
            }
            Some(Ok(Take::Granted(n))) => {
                self.window.add_permits(want - n.min(want));
                let want = n.min(want);
                Ok((want, Some(want)))
            }
            Some(Ok(Take::Wait(d))) => {
                self.window.add_permits(want);
                Err(Next::RetryAfter(d))
            }
            Some(Err(e)) => {
                self.window.add_permits(want);
                self.lane.redis.down(&e);
                Err(Next::RetryAfter(self.redis_backoff.next_delay()))
            }
        }
    }

    /// Claims up to `want` members and hands them to the settler; returns
    /// them with Redis's clock at the claim. From here on, no cancellation
    /// until every claimed member is handed over.
    async fn claim(
        &mut self,
        want: usize,
        granted: Option<usize>,
    ) -> Step<(i64, Vec<(u64, Arc<Claimed>)>)> {
        let (lane, b) = (self.lane, &self.lane.business);
        let claim = match &lane.fair {
            None => lane.store.claim(want, b.lease).await,
            Some(fair) if self.express => fair.claim_fresh(&lane.store, want, b.lease).await,
            Some(fair) => fair.claim(&lane.store, want, b.lease).await,
        };
        let claim = match claim {
            Ok(c) => c,
            Err(e) => {
                self.window.add_permits(want);
                give_back(lane, granted, 0);
                return Err(self.claim_failed(e));
            }
        };
        let claimed_at = Instant::now();
        if self.index == 0 {
            lane.lead_claims.fetch_add(1, Ordering::Relaxed);
        }
        lane.redis.up();
        self.redis_backoff.reset();
        if self.wrong_type_logged {
            tracing::info!("the key is a sorted set again; dispatching resumes");
            self.wrong_type_logged = false;
        }
        add_to(&METRICS.claims, &[&b.name], 1);
        report_claim(b, &claim);
        let got = claim.members.len();
        self.window.add_permits(want - got);
        give_back(lane, granted, got);
        if got == 0 && claim.dead_no_body + claim.deduplicated > 0 {
            // The whole batch was dropped, and more may be due behind it.
            return Err(Next::Again);
        }
        if claim.paused && (self.index == 0 || self.express) {
            // Paused by an operator: the leader looks again in a second,
            // the others wait for it as when idle.
            return Err(Next::RetryAfter(Duration::from_secs(1)));
        }
        if got == 0 && self.express {
            // Another scanner took what the look saw, or what it saw cannot
            // go yet (the claim's report now names it): look again soon.
            return Err(Next::RetryAfter(WAKE_GAP));
        }
        if got == 0 {
            idle(lane, self.index, &claim, claimed_at, self.stop).await;
            return Err(Next::Again);
        }
        add_to(&METRICS.claimed, &[&b.name], got as u64);
        self.look_now = self.express;
        if got == want && !self.express {
            // A full batch: likely more is due, so bring the others in.
            lane.all_wake.notify_waiters();
        }
        let info = Arc::new(ClaimInfo {
            tag: claim.tag,
            record: claim.record.as_deref().map(Arc::from),
            now_ms: claim.now_ms,
            at: claimed_at,
        });
        let slots = lane
            .fair
            .as_ref()
            .map(|f| f.hold(&claim.members))
            .unwrap_or_default();
        let members: Vec<(u64, Arc<Claimed>)> = claim
            .members
            .into_iter()
            .map(|c| {
                self.seq += 1;
                (self.seq, Arc::new(c))
            })
            .collect();
        let now_ms = info.now_ms;
        let _ = self
            .tx
            .send(ToSettle::Claimed(info, members.clone(), slots));
        if self.stop.is_cancelled() {
            // A claim that Redis answered after the stop (it was frozen, or
            // slow): hand it back unpublished rather than publish it as the
            // process leaves.
            self.hand_back(&members);
            return Err(Next::Again);
        }
        Ok((now_ms, members))
    }

    /// What a failed claim means: a key of the wrong type waits for the
    /// user to fix it, anything else is Redis being down.
    fn claim_failed(&mut self, e: crate::store::StoreError) -> Next {
        let b = &self.lane.business;
        if e.is_wrong_type() {
            self.lane.redis.up();
            if !self.wrong_type_logged {
                tracing::error!(error = %e, "the key is not a sorted set; producers must ZADD to it. This business waits until the key is fixed; the others go on");
                self.wrong_type_logged = true;
            }
            Next::RetryAfter(b.poll_interval.max(Duration::from_secs(1)))
        } else {
            self.lane.redis.down(&e);
            Next::RetryAfter(self.redis_backoff.next_delay())
        }
    }

    /// Tells the settler that `members` were never published.
    fn hand_back(&self, members: &[(u64, Arc<Claimed>)]) {
        let _ = self.tx.send(ToSettle::Unpublished(
            members.iter().map(|(s, _)| *s).collect(),
        ));
    }

    /// Publishes a claimed batch and hands each confirm to the settler.
    async fn publish(
        &mut self,
        ch: &Channel,
        now_ms: i64,
        members: Vec<(u64, Arc<Claimed>)>,
    ) -> Step<()> {
        let (b, broker) = (&self.lane.business, self.broker);
        // Every publish of the batch is started before any is awaited: lapin
        // queues their frames in order and its I/O loop writes them in one
        // go, instead of one wake-up and round trip per message.
        let key = &self.lane.store.keys().pending;
        let progress = AtomicU64::new(0);
        let publishes = futures::future::join_all(members.iter().map(|(_, c)| {
            let progress = &progress;
            async move {
                let m = message::of(b, key, c, now_ms);
                let r = amqp::publish(ch, &b.exchange, m.routing_key, m.body, m.properties).await;
                progress.fetch_add(1, Ordering::Relaxed);
                r
            }
        }));
        let blocked = || broker.is_blocked();
        let given_up = publish_or_give_up(
            publishes,
            &progress,
            blocked,
            self.stop,
            self.drain_deadline,
        );
        let results = match given_up.await {
            Published::All(results) => results,
            Published::Stalled => {
                // The frames never left: the connection is dead without
                // saying so. Hand the batch back and start over on a new
                // channel.
                tracing::warn!(
                    members = members.len(),
                    "publishing stalled for {PUBLISH_STALL:?} while the broker was not blocking; handing the batch back and reopening the channel"
                );
                self.hand_back(&members);
                self.channel = None;
                return Err(Next::Again);
            }
            Published::Deadline => {
                // Stopping, and the broker still blocks: what never left
                // goes back to pending now (the settler does it), rather
                // than waiting for a lease to expire.
                tracing::warn!(
                    members = members.len(),
                    "shutdown_timeout reached while the broker still blocks publishing; handing the batch back"
                );
                self.hand_back(&members);
                return Err(Next::Stop);
            }
        };
        let mut confirms = Vec::with_capacity(members.len());
        let mut unpublished = Vec::new();
        let mut first_error = None;
        for ((s, _), result) in members.iter().zip(results) {
            match result {
                Ok(confirm) => confirms.push((*s, confirm)),
                Err(e) => {
                    first_error.get_or_insert(e);
                    unpublished.push(*s);
                }
            }
        }
        add_to(&METRICS.published, &[&b.name], confirms.len() as u64);
        if !confirms.is_empty() {
            let _ = self.tx.send(ToSettle::Published(confirms, ch.clone()));
        }
        let Some(e) = first_error else {
            self.amqp_backoff.reset();
            return Ok(());
        };
        let topology = topology_error(&e);
        if let Some(reason) = &topology {
            self.lane.pause.pause(&b.name, reason);
        } else if !self.channel_error_logged {
            tracing::warn!(error = %e, unpublished = unpublished.len(), "publish failed; handing those members back and reopening the channel");
            self.channel_error_logged = true;
        }
        let _ = self.tx.send(ToSettle::Unpublished(unpublished));
        self.reopen = true;
        match topology {
            Some(_) => Err(Next::Again),
            // Any other broker error is retried with backoff, not at once:
            // one that repeats would otherwise spin.
            None => Err(Next::RetryAfter(self.amqp_backoff.next_delay())),
        }
    }
}

/// Counts and logs what a claim found besides due members: recovered
/// leases, ids without a body, leases expired on the last attempt, and
/// duplicates dropped.
fn report_claim(b: &Business, claim: &crate::store::Claim) {
    if claim.recovered > 0 {
        add_to(&METRICS.recovered, &[&b.name], claim.recovered);
        tracing::warn!(
            recovered = claim.recovered,
            "recovered members whose lease expired (a dispatcher died or stalled); they will be published again"
        );
    }
    if claim.dead_no_body > 0 {
        count_dead(b, "no body", claim.dead_no_body);
        tracing::error!(
            dead = claim.dead_no_body,
            reason = "no body",
            "ids came due with no body in the body hash; moved to the dead set unpublished (schedule body and id in one MULTI)"
        );
    }
    if claim.dead_lease_expired > 0 {
        count_dead(b, "lease expired", claim.dead_lease_expired);
        tracing::error!(
            dead = claim.dead_lease_expired,
            max_attempts = b.max_attempts,
            "members whose lease expired on their last allowed attempt moved to the dead set (a process keeps dying or stalling on them); see delayd dead list"
        );
    }
    if claim.deduplicated > 0 {
        add_to(&METRICS.deduplicated, &[&b.name], claim.deduplicated);
    }
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

/// The earliest pending member's due time: `K`'s head, and with tenants the
/// earlier of it and the tenants' index head.
async fn head_due_ms(lane: &Lane) -> Result<Option<i64>, crate::store::StoreError> {
    let head = lane.store.head_due_ms().await?;
    let Some(fair) = &lane.fair else {
        return Ok(head);
    };
    let tenants = lane.store.tenants_head_due_ms(&fair.held()).await?;
    Ok(match (head, tenants) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// Resolves when a tenant held back at its `tenant_window` has room again:
/// its due members are claimed then, not at the next due time.
async fn freed(lane: &Lane) {
    match &lane.fair {
        Some(fair) => fair.freed().await,
        None => std::future::pending().await,
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
            _ = freed(lane) => return,
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
        let Ok(head) = head_due_ms(lane).await else {
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
