//! The Redis side: key names, the Lua scripts, and one typed call per script.
//!
//! Every script touches exactly one key family, whose keys share a hash tag,
//! so each runs on Redis Cluster as well as on a single server.

use crate::redis_conn::scripts;
use std::time::Duration;

use crate::config::{MemberMode, ScoreUnit};
pub use crate::keys::KeyFamily;
use crate::redis_conn::RedisConn;

/// A Redis failure, as seen by a scanner or a command.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis answered with an error or the connection failed.
    #[error("{}", crate::redis_conn::describe(.0))]
    Redis(#[from] redis::RedisError),
    /// A script returned something it never returns; a bug or a foreign script.
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
}

impl StoreError {
    /// True when the key holds something other than a sorted set, which
    /// only a producer can fix.
    pub fn is_wrong_type(&self) -> bool {
        // Inside a script the WRONGTYPE code arrives wrapped in the script
        // error, so the message is the only reliable sign.
        matches!(self, StoreError::Redis(e) if e.to_string().contains("WRONGTYPE"))
    }
}

/// The server's `notify-keyspace-events` flags, or `None` where `CONFIG` is
/// forbidden (as on many managed services).
pub async fn keyspace_flags<C: redis::aio::ConnectionLike>(conn: &mut C) -> Option<String> {
    redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async::<Vec<String>>(conn)
        .await
        .ok()
        .and_then(|v| v.into_iter().nth(1))
}

/// Why a server's `maxmemory-policy` can lose delayd's work, if it can: an
/// `allkeys-*` policy evicts any key under memory pressure, `K` and
/// `{K}:inflight` included, without a word. `None` where it cannot, or where
/// `CONFIG` is forbidden.
pub async fn eviction_risk<C: redis::aio::ConnectionLike>(conn: &mut C) -> Option<String> {
    let policy = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async::<Vec<String>>(conn)
        .await
        .ok()?
        .into_iter()
        .nth(1)?;
    policy.starts_with("allkeys-").then(|| {
        format!("maxmemory-policy is \"{policy}\": under memory pressure Redis may evict pending and in-flight work; use \"noeviction\" (or a volatile-* policy, since delayd's keys have no TTL)")
    })
}

/// Whether `flags` publish the sorted-set keyspace events delayd wakes on.
pub fn flags_notify_zsets(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('z') || flags.contains('A'))
}

mod bulk;
mod dead;
mod forecast;
mod glimpse;
pub mod incoming;
mod pause;
mod tenant_control;
mod tenants;
mod totals;
pub use bulk::{PendingAct, PendingPick, PendingStep};
pub use dead::{DeadOp, DeadPick, DeadStep};
pub use forecast::DueCounts;
pub use glimpse::Glimpse;
pub use tenant_control::{TenantPage, TenantRow};
pub use tenants::{indexed, Indexed, TenantBudget, TenantDue, TenantTake, TenantsHead};
pub use totals::{Counts, Totals};

/// Most members in one settle call: Lua's `unpack` is bounded, and one call
/// should hold Redis for a few milliseconds at most.
const CALL_MEMBERS: usize = 2000;
/// Most body bytes in one settle call, far below Redis's query buffer limit.
const CALL_BYTES: usize = 8 << 20;
/// Most member and body bytes one claim takes (it takes one member however
/// large): a reply must be read well within the response timeout, or its
/// members sit in flight for a lease and are claimed again, for ever.
pub const CLAIM_BYTES: usize = 8 << 20;

/// One claimed member.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The member: the body in body mode, the task id in id mode.
    pub member: Vec<u8>,
    /// Original due time, epoch ms.
    pub due_ms: i64,
    /// Which attempt this publish is (1 for the first).
    pub attempt: u32,
    /// Id mode: the body read beside the id in the claim call.
    pub body: Option<Vec<u8>>,
    /// With tenants: the tenant whose set the claim moved it from (`None`
    /// for a member that was already in `K`). Its ack looks for the id
    /// scheduled again there, and its tenant's unconfirmed publishes count
    /// it.
    pub tenant: Option<std::sync::Arc<[u8]>>,
}

impl Claimed {
    /// The bytes to publish: the body kept beside the id in id mode, the
    /// member itself in body mode.
    pub fn body(&self) -> &[u8] {
        self.body.as_deref().unwrap_or(&self.member)
    }
}

/// What one claim call found.
#[derive(Debug, Default)]
pub struct Claim {
    /// Redis's clock when the script ran, epoch ms.
    pub now_ms: i64,
    /// Due time of the earliest member left pending, when it was looked up
    /// (only when the claim came back short of its limit).
    pub next_due_ms: Option<i64>,
    /// Expired leases moved back to pending.
    pub recovered: u64,
    /// The id of this claim's record of due times, if it wrote one: pass it
    /// to [`Store::ack`] or [`Store::forget`] once every member of the claim
    /// is settled.
    pub record: Option<String>,
    /// The claim's tag: every settle write names it, and acts only on
    /// members this claim still holds.
    pub tag: u16,
    /// Id mode: members dead-lettered by the claim because no body was
    /// stored for them (reason `no body`).
    pub dead_no_body: u64,
    /// Id mode: members dropped because they were delivered within the
    /// `dedup_window`.
    pub deduplicated: u64,
    /// Recovered members whose expired lease was their last allowed attempt,
    /// moved to the dead set (reason `lease expired after N attempts`).
    pub dead_lease_expired: u64,
    /// True while an operator has paused the business: nothing was
    /// claimed, whatever is due.
    pub paused: bool,
    /// The members now leased to the caller.
    pub members: Vec<Claimed>,
}

/// A consistent snapshot of one key family.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    /// Redis's clock, epoch ms.
    pub now_ms: i64,
    /// Its members, counted by state.
    #[serde(flatten)]
    pub counts: Counts,
    /// Due time of the oldest overdue member, epoch ms.
    pub oldest_due_ms: Option<f64>,
    /// Due time of the next member not yet due, epoch ms.
    pub next_due_ms: Option<f64>,
    /// Set while an operator has paused the business.
    pub paused: Option<Paused>,
    /// Tenants in the index (0 for a business without tenants).
    pub tenants: u64,
    /// Tenants whose sets the counts above include: the [`STATS_TENANTS`]
    /// due earliest, so fewer than `tenants` when there are more.
    pub tenants_counted: u64,
}

/// Most tenants whose sets a stats call counts, the earliest due first: it
/// bounds a scrape's cost (five commands a tenant) however many exist.
pub const STATS_TENANTS: usize = 1000;

/// An operator's pause of a business, as its key records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Paused {
    /// Since when, epoch ms on Redis's clock.
    pub since_ms: i64,
    /// Who paused it: the token's name (`admin_token`) or `cli`.
    pub by: String,
}

impl Paused {
    /// The key's value, `"<since ms> <by>"`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, by) = text.split_once(' ')?;
        Some(Self {
            since_ms: ms.parse().ok()?,
            by: by.to_string(),
        })
    }
}

/// The windows of the `delayd_pending_due_within` forecast: label, ms.
pub const FORECAST_WINDOWS: [(&str, u64); 3] =
    [("1m", 60_000), ("1h", 3_600_000), ("1d", 86_400_000)];

/// One dead member as `dead list` shows it.
#[derive(Debug, Clone)]
pub struct DeadMember {
    /// The member (the id, or the body in body mode), as a glimpse.
    pub member: Glimpse,
    /// When it died, epoch ms.
    pub died_ms: f64,
    /// Why it died.
    pub reason: String,
}

/// Members one claim holds, by the claim's tag.
pub type Held<T> = (u16, Vec<T>);

/// How refused or unconfirmed members go back (see `retry.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Back {
    /// Never confirmed: back at the original due time, attempt not counted.
    Release,
    /// Refused for now (a nack): back after the first backoff, attempt not
    /// counted, never dead.
    Nack,
    /// Refused for good (returned, rejected): back with doubling backoff,
    /// or dead after `max_attempts`.
    Refused,
}

impl Back {
    fn as_str(self) -> &'static str {
        match self {
            Back::Release => "release",
            Back::Nack => "nack",
            Back::Refused => "refused",
        }
    }
}

/// What to do with members going back, besides their mode.
#[derive(Debug, Clone, Copy)]
pub struct BackPolicy<'a> {
    /// Why, for the dead set and logs.
    pub reason: &'a str,
    /// Attempts before a refused member is dead.
    pub max_attempts: u32,
    /// First backoff (and the nack delay).
    pub backoff: Duration,
    /// Cap of the doubling backoff.
    pub backoff_max: Duration,
}

/// Outcome of a settle call that hands members back.
#[derive(Debug, Default, Clone, Copy)]
pub struct BackOutcome {
    /// Members back in pending.
    pub back: u64,
    /// Members moved to the dead set.
    pub dead: u64,
    /// Members this claim no longer held (already settled by an earlier run
    /// of the same write, or recovered and taken by another claim).
    pub skipped: u64,
}

/// Outcome of one maintenance sweep.
#[derive(Debug, Default, Clone, Copy)]
pub struct SweepOutcome {
    /// Stale retry state deleted (cancelled or re-added members).
    pub meta: u64,
    /// Orphaned claim records deleted.
    pub records: u64,
}

/// Appends one settle call's groups as ARGV `{tag, n, m1..mn}`, the layout
/// `ack.lua` (after its tenants) and `extend.lua` read; `member` gives each
/// member's bytes.
fn push_groups<T>(
    inv: &mut redis::ScriptInvocation<'_>,
    call: &[(u16, &[T])],
    member: impl Fn(&T) -> &[u8],
) {
    for (tag, members) in call {
        inv.arg(tag).arg(members.len());
        for m in *members {
            inv.arg(member(m));
        }
    }
}

/// Splits groups into calls of at most [`CALL_MEMBERS`] members and about
/// [`CALL_BYTES`] bytes; a group may be split, its tag travels with each part.
fn calls<T>(groups: &[Held<T>], bytes: impl Fn(&T) -> usize) -> Vec<Vec<(u16, &[T])>> {
    let mut out = vec![Vec::new()];
    let (mut n, mut size) = (0usize, 0usize);
    for (tag, members) in groups {
        let mut start = 0;
        for (i, m) in members.iter().enumerate() {
            let b = bytes(m) + 16;
            if n > 0 && (n >= CALL_MEMBERS || size + b > CALL_BYTES) {
                if i > start {
                    out.last_mut()
                        .expect("non-empty")
                        .push((*tag, &members[start..i]));
                }
                out.push(Vec::new());
                start = i;
                n = 0;
                size = 0;
            }
            n += 1;
            size += b;
        }
        if members.len() > start {
            out.last_mut()
                .expect("non-empty")
                .push((*tag, &members[start..]));
        }
    }
    out
}

/// Typed calls to the scripts for one key family.
#[derive(Clone)]
pub struct Store {
    conn: RedisConn,
    keys: KeyFamily,
    unit: ScoreUnit,
    member: MemberMode,
    /// Id-mode bodies are intake envelopes (the business has an intake):
    /// its dedup record names each id with its content, so a different
    /// message reusing a delivered id is delivered too.
    envelopes: bool,
    /// The business has tenants ([`Store::with_tenants`]).
    tenants: bool,
    /// Bulk actions on one tenant's set ([`Store::in_tenant`]): the tenant
    /// and its set's key, which the bulk calls read in place of `K`.
    tenant: Option<(String, String)>,
    /// Attempts before a member is dead-lettered: the claim applies it to
    /// members whose lease expired.
    max_attempts: u32,
}

impl Store {
    /// A store for `keys` over a shared, self-reconnecting connection.
    pub fn new(conn: impl Into<RedisConn>, keys: KeyFamily, unit: ScoreUnit) -> Self {
        Self {
            conn: conn.into(),
            keys,
            unit,
            member: MemberMode::Body,
            envelopes: false,
            tenants: false,
            tenant: None,
            max_attempts: crate::config::defaults::MAX_ATTEMPTS,
        }
    }

    /// The store of `b`'s key `key`, set up as the business says: its
    /// member mode, intake envelopes, tenants and attempts.
    pub fn of_business(conn: impl Into<RedisConn>, key: &str, b: &crate::config::Business) -> Self {
        Self {
            member: b.member,
            envelopes: b.intake.is_some(),
            tenants: b.tenants.is_some(),
            max_attempts: b.max_attempts,
            ..Self::new(conn, KeyFamily::new(key), b.score_unit)
        }
    }

    /// The same store for a business whose members are `member` (body
    /// mode unless set): the claim and ack scripts consult it.
    pub fn with_member(mut self, member: MemberMode) -> Self {
        self.member = member;
        self
    }

    /// The same store for a business with tenants: its stats count the
    /// tenants' sets beside `K`.
    pub fn with_tenants(mut self, tenants: bool) -> Self {
        self.tenants = tenants;
        self
    }

    /// `'1'` in id mode (`'2'` with envelopes), and the dedup window in ms
    /// (0 for none), as the scripts take them.
    fn mode_args(&self) -> (&'static str, u64) {
        (
            match (self.member.is_id(), self.envelopes) {
                (false, _) => "0",
                (true, false) => "1",
                (true, true) => "2",
            },
            self.member
                .dedup_window()
                .map_or(0, |w| w.as_millis().min(u64::MAX as u128) as u64),
        )
    }

    /// The key family this store works on.
    pub fn keys(&self) -> &KeyFamily {
        &self.keys
    }

    /// Recovers expired leases and claims up to `limit` due members.
    pub async fn claim(&self, limit: usize, lease: Duration) -> Result<Claim, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = self
            .claim_call(&scripts::CLAIM, limit, lease)
            .invoke_async(&mut conn)
            .await?;
        parse_claim(reply, self.member.is_id())
    }

    /// `script` with `claim.lua`'s KEYS and ARGV, which `claim_tenants.lua`
    /// takes first too, before its own.
    fn claim_call<'a>(
        &self,
        script: &'a redis::Script,
        limit: usize,
        lease: Duration,
    ) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.keys.pending)
            .key(&self.keys.inflight)
            .key(&self.keys.meta)
            .key(&self.keys.claims)
            .key(&self.keys.body)
            .key(&self.keys.delivered)
            .key(&self.keys.dead)
            .key(&self.keys.reasons)
            .key(&self.keys.paused)
            .arg(limit)
            .arg(lease.as_millis() as u64)
            .arg(self.unit.millis())
            .arg(limit.clamp(100, 1000))
            .arg(rand::random_range(1..1024u16))
            .arg(self.mode_args().0)
            .arg(self.mode_args().1)
            .arg(CLAIM_BYTES)
            .arg(self.max_attempts);
        inv
    }

    /// Forgets members the broker confirmed, and, in the same atomic step,
    /// the records of the claims this completes. Members another claim
    /// holds now are left alone, so repeating the call is harmless.
    pub async fn ack(
        &self,
        groups: &[Held<&Claimed>],
        records: &[String],
    ) -> Result<u64, StoreError> {
        if groups.iter().all(|g| g.1.is_empty()) && records.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        let mut total = 0;
        let calls = calls(groups, |c| c.member.len());
        let last = calls.len() - 1;
        for (i, call) in calls.into_iter().enumerate() {
            // The records go with the last call: deleted only if all of
            // their members were.
            let records = if i == last { records } else { &[] };
            let mut inv = scripts::ACK.prepare_invoke();
            inv.key(&self.keys.inflight)
                .key(&self.keys.meta)
                .key(&self.keys.claims)
                .key(&self.keys.pending)
                .key(&self.keys.body)
                .key(&self.keys.delivered)
                .arg(self.mode_args().0)
                .arg(self.mode_args().1)
                .arg(records.len());
            for r in records {
                inv.arg(r.as_str());
            }
            self.push_owners(&mut inv, &call);
            push_groups(&mut inv, &call, |c| &c.member[..]);
            total += inv.invoke_async::<u64>(&mut conn).await?;
        }
        Ok(total)
    }

    /// Appends `ack.lua`'s tenant section: the prefix of tenant set names
    /// and, in id mode, the tenant each claimed id was moved from, where a
    /// producer may have scheduled it again while it was in flight.
    fn push_owners(&self, inv: &mut redis::ScriptInvocation<'_>, call: &[(u16, &[&Claimed])]) {
        let owned: Vec<(&[u8], &[u8])> = if self.tenants && self.member.is_id() {
            call.iter()
                .flat_map(|(_, ms)| ms.iter())
                .filter_map(|c| Some((&c.member[..], c.tenant.as_deref()?)))
                .collect()
        } else {
            Vec::new()
        };
        // The prefix only where an id is looked for under it.
        if owned.is_empty() {
            inv.arg("").arg(0);
        } else {
            inv.arg(self.keys.tenant_prefix()).arg(owned.len());
        }
        for (m, t) in owned {
            inv.arg(m).arg(t);
        }
    }

    /// Hands members back to pending (or, refused too often, to the dead
    /// set). Members another claim holds now are skipped, so repeating the
    /// call after a lost reply is harmless.
    pub async fn back(
        &self,
        mode: Back,
        groups: &[Held<&Claimed>],
        policy: &BackPolicy<'_>,
    ) -> Result<BackOutcome, StoreError> {
        let mut out = BackOutcome::default();
        if groups.iter().all(|g| g.1.is_empty()) {
            return Ok(out);
        }
        let mut conn = self.conn.clone();
        for call in calls(groups, |c| c.member.len()) {
            let mut inv = scripts::RETRY.prepare_invoke();
            inv.key(&self.keys.pending)
                .key(&self.keys.inflight)
                .key(&self.keys.meta)
                .key(&self.keys.dead)
                .key(&self.keys.reasons)
                .arg(mode.as_str())
                .arg(policy.max_attempts)
                .arg(policy.backoff.as_millis() as u64)
                .arg(policy.backoff_max.as_millis() as u64)
                .arg(self.unit.millis())
                .arg(policy.reason);
            for (tag, members) in call {
                inv.arg(tag).arg(members.len());
                for c in members {
                    inv.arg(c.member.as_slice()).arg(c.due_ms).arg(c.attempt);
                }
            }
            let (back, dead, skipped): (u64, u64, u64) = inv.invoke_async(&mut conn).await?;
            out.back += back;
            out.dead += dead;
            out.skipped += skipped;
        }
        Ok(out)
    }

    /// Deletes the records of claims whose members are all settled.
    pub async fn forget(&self, records: &[String]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        for chunk in records.chunks(CALL_MEMBERS) {
            let _: i64 = redis::cmd("HDEL")
                .arg(&self.keys.claims)
                .arg(chunk)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Pushes the lease deadline of members their claims still hold.
    pub async fn extend(&self, groups: &[Held<&[u8]>], lease: Duration) -> Result<u64, StoreError> {
        let mut total = 0;
        if groups.iter().all(|g| g.1.is_empty()) {
            return Ok(total);
        }
        let mut conn = self.conn.clone();
        for call in calls(groups, |m| m.len()) {
            let mut inv = scripts::EXTEND.prepare_invoke();
            inv.key(&self.keys.inflight).arg(lease.as_millis() as u64);
            push_groups(&mut inv, &call, |m| m);
            total += inv.invoke_async::<u64>(&mut conn).await?;
        }
        Ok(total)
    }

    /// One full pass over the retry state and the claim records, deleting
    /// what no member needs any more (cancelled or re-added members, records
    /// whose settle write was lost). A few hundred fields per call.
    pub async fn sweep(&self, lease: Duration) -> Result<SweepOutcome, StoreError> {
        let mut out = SweepOutcome::default();
        let mut cursor = "0".to_string();
        loop {
            let (next, slice, _) = self.sweep_slice(&cursor, 200, lease).await?;
            out.meta += slice.meta;
            out.records += slice.records;
            if next == "0" {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// One stretch of a sweep pass from `cursor`, looking at about `budget`
    /// retry-state entries (200 per call), so that after a nack storm a pass
    /// is spread over several sweeps instead of reading the whole hash each
    /// time. Returns the cursor to continue from (`"0"`: the pass is done),
    /// what was deleted, and how many entries are left.
    pub async fn sweep_slice(
        &self,
        cursor: &str,
        budget: u64,
        lease: Duration,
    ) -> Result<(String, SweepOutcome, u64), StoreError> {
        let mut conn = self.conn.clone();
        let mut out = SweepOutcome::default();
        let mut cursor = cursor.to_string();
        let mut looked = 0;
        loop {
            let (next, meta, records, len): (String, u64, u64, u64) = scripts::SWEEP
                .key(&self.keys.pending)
                .key(&self.keys.inflight)
                .key(&self.keys.meta)
                .key(&self.keys.claims)
                .arg(&cursor)
                .arg(200)
                .arg(lease.as_millis() as u64)
                .invoke_async(&mut conn)
                .await?;
            out.meta += meta;
            out.records += records;
            looked += 200;
            if next == "0" || looked >= budget {
                return Ok((next, out, len));
            }
            cursor = next;
        }
    }

    /// Id mode: one stretch of a pass over `{K}:body` from `cursor`,
    /// deleting bodies whose id is not pending, in flight or dead (a bare
    /// `ZREM` cancel leaves them). Looks at about `budget` fields, a few
    /// hundred per call, so a pass is spread over several sweeps. Returns
    /// the cursor to continue from (`"0"`: the pass is done), the bodies
    /// deleted and the hash's length.
    pub async fn sweep_bodies(
        &self,
        cursor: &str,
        budget: u64,
    ) -> Result<(String, u64, u64), StoreError> {
        if !self.member.is_id() {
            return Ok(("0".into(), 0, 0));
        }
        let mut conn = self.conn.clone();
        let mut cursor = cursor.to_string();
        let (mut deleted, mut looked) = (0, 0);
        loop {
            let (next, n, len): (String, u64, u64) = scripts::SWEEP_BODY
                .key(&self.keys.pending)
                .key(&self.keys.inflight)
                .key(&self.keys.dead)
                .key(&self.keys.body)
                .arg(&cursor)
                .arg(500)
                .invoke_async(&mut conn)
                .await?;
            deleted += n;
            looked += 500;
            if next == "0" || looked >= budget {
                return Ok((next, deleted, len));
            }
            cursor = next;
        }
    }

    /// Due time of the earliest pending member, epoch ms (`i64::MIN` for
    /// `-inf`), or `None` when nothing is pending. One `ZRANGE`, a fraction
    /// of a claim's cost: it decides whether a wake-up hint needs a claim.
    pub async fn head_due_ms(&self) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.pending)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        // `as` saturates, so -inf and huge scores stay ordered.
        Ok(reply
            .first()
            .map(|(_, score)| (score * self.unit.millis() as f64) as i64))
    }

    /// A consistent snapshot of pending, due, in-flight and dead counts,
    /// and the forecast of what comes due soon; with tenants, over `K` and
    /// the sets of the [`STATS_TENANTS`] tenants due earliest.
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = scripts::STATS.prepare_invoke();
        inv.key(&self.keys.pending)
            .key(&self.keys.inflight)
            .key(&self.keys.dead)
            .key(&self.keys.paused)
            .key(self.keys.tenant_index())
            .arg(self.unit.millis());
        if self.tenants {
            inv.arg(self.keys.tenant_prefix()).arg(STATS_TENANTS);
        } else {
            inv.arg("").arg(0);
        }
        for (_, ms) in FORECAST_WINDOWS {
            inv.arg(ms);
        }
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        parse_stats(reply)
    }

    /// Up to `limit` dead members after the `skip` oldest, Redis's clock,
    /// and whether the call stopped short at its byte bound
    /// (`dead_list.lua`) with more to read.
    pub async fn dead_page(
        &self,
        skip: usize,
        limit: usize,
    ) -> Result<(i64, Vec<DeadMember>, bool), StoreError> {
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = scripts::DEAD_LIST
            .key(&self.keys.dead)
            .key(&self.keys.reasons)
            .arg(limit)
            .arg(skip)
            .invoke_async(&mut conn)
            .await?;
        let mut it = reply.into_iter();
        let now = int_of(it.next())?;
        let short = int_of(it.next())? == 1;
        let mut out = Vec::new();
        while let Some(member) = Glimpse::read(&mut it)? {
            let (Some(died), Some(reason)) = (it.next(), it.next()) else {
                return Err(StoreError::Reply("dead list chunk".into()));
            };
            out.push(DeadMember {
                member,
                died_ms: String::from_utf8_lossy(&bytes_of(&died)?)
                    .parse()
                    .unwrap_or(0.0),
                reason: String::from_utf8_lossy(&bytes_of(&reason)?).into_owned(),
            });
        }
        Ok((now, out, short))
    }
}

pub(crate) fn int_of(v: Option<redis::Value>) -> Result<i64, StoreError> {
    match v {
        Some(redis::Value::Int(n)) => Ok(n),
        // Scripts pass some integers through as the digits Redis printed.
        Some(redis::Value::BulkString(b)) => std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                StoreError::Reply(format!(
                    "expected an integer, got {:?}",
                    String::from_utf8_lossy(&b)
                ))
            }),
        other => Err(StoreError::Reply(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

/// A score as Redis printed it, exact for a cursor.
pub(crate) fn score_text(v: Option<redis::Value>) -> Result<String, StoreError> {
    let v = v.ok_or_else(|| StoreError::Reply("a score is missing".into()))?;
    Ok(String::from_utf8_lossy(&bytes_of(&v)?).into_owned())
}

pub(crate) fn bytes_of(v: &redis::Value) -> Result<Vec<u8>, StoreError> {
    match v {
        redis::Value::BulkString(b) => Ok(b.clone()),
        redis::Value::SimpleString(s) => Ok(s.as_bytes().to_vec()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

fn parse_stats(reply: Vec<redis::Value>) -> Result<Stats, StoreError> {
    let text = |v: Option<redis::Value>| -> Result<String, StoreError> {
        let v = v.ok_or_else(|| StoreError::Reply("stats reply too short".into()))?;
        Ok(String::from_utf8_lossy(&bytes_of(&v)?).into_owned())
    };
    let mut it = reply.into_iter();
    let now = text(it.next())?;
    let pending = int_of(it.next())? as u64;
    let due_now = int_of(it.next())? as u64;
    let oldest = text(it.next())?;
    let next = text(it.next())?;
    let in_flight = int_of(it.next())? as u64;
    let dead = int_of(it.next())? as u64;
    let paused = Paused::parse(&text(it.next())?);
    let mut due_within = [0; 3];
    for slot in &mut due_within {
        *slot = int_of(it.next())? as u64;
    }
    let tenants = int_of(it.next())? as u64;
    let tenants_counted = int_of(it.next())? as u64;
    Ok(Stats {
        tenants,
        tenants_counted,
        now_ms: now.parse().map_err(|_| StoreError::Reply(now.clone()))?,
        counts: Counts {
            pending,
            due_now,
            in_flight,
            dead,
            due_within,
        },
        oldest_due_ms: oldest.parse().ok(),
        next_due_ms: next.parse().ok(),
        paused,
    })
}

fn parse_claim(reply: Vec<redis::Value>, id_mode: bool) -> Result<Claim, StoreError> {
    let mut it = reply.into_iter();
    let now_ms = int_of(it.next())?;
    let next = int_of(it.next())?;
    let recovered = int_of(it.next())? as u64;
    let record = match it.next() {
        Some(redis::Value::BulkString(b)) if b.is_empty() => None,
        Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        other => return Err(StoreError::Reply(format!("claim record {other:?}"))),
    };
    let tag = int_of(it.next())?;
    let tag = u16::try_from(tag)
        .ok()
        .filter(|t| (1..1024).contains(t))
        .ok_or_else(|| StoreError::Reply(format!("claim tag {tag}")))?;
    let dead_no_body = int_of(it.next())? as u64;
    let deduplicated = int_of(it.next())? as u64;
    let dead_lease_expired = int_of(it.next())? as u64;
    let paused = int_of(it.next())? == 1;
    let rest: Vec<redis::Value> = it.collect();
    let mut members = Vec::with_capacity(rest.len() / 3);
    let mut rest = rest.into_iter();
    while let Some(m) = rest.next() {
        let member = match m {
            redis::Value::BulkString(b) => b,
            other => return Err(StoreError::Reply(format!("member {other:?}"))),
        };
        let due_ms = int_of(rest.next())?;
        let attempt = int_of(rest.next())?.clamp(1, u32::MAX as i64) as u32;
        let body = if id_mode {
            match rest.next() {
                Some(redis::Value::BulkString(b)) => Some(b),
                other => return Err(StoreError::Reply(format!("body {other:?}"))),
            }
        } else {
            None
        };
        members.push(Claimed {
            member,
            due_ms,
            attempt,
            body,
            tenant: None,
        });
    }
    Ok(Claim {
        now_ms,
        next_due_ms: (next != -1).then_some(next),
        recovered,
        record,
        tag,
        dead_no_body,
        deduplicated,
        dead_lease_expired,
        paused,
        members,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use redis::Value::{self, BulkString, Int};

    /// A claim reply: its fixed head (`now`, no next due, none recovered,
    /// `record`, `tag`, `dropped` as dead for want of a body and as
    /// delivered within the window), then `rest`.
    fn reply(
        now: i64,
        record: &[u8],
        tag: i64,
        dropped: (i64, i64),
        rest: Vec<Value>,
    ) -> Vec<Value> {
        let mut v = vec![
            Int(now),
            Int(-1),
            Int(0),
            BulkString(record.to_vec()),
            Int(tag),
            Int(dropped.0),
            Int(dropped.1),
            Int(0),
            // Not paused.
            Int(0),
        ];
        v.extend(rest);
        v
    }

    #[test]
    fn claim_replies_take_due_times_as_integers_or_digits() {
        let good = reply(
            1000,
            b"1000:7",
            7,
            (0, 0),
            vec![
                BulkString(b"a".to_vec()),
                BulkString(b"1790000000000".to_vec()),
                Int(1),
                BulkString(Vec::new()),
                Int(5),
                Int(2),
            ],
        );
        let c = parse_claim(good, false).unwrap();
        assert_eq!(c.members.len(), 2);
        assert_eq!(c.record.as_deref(), Some("1000:7"));
        assert_eq!(c.tag, 7);
        assert_eq!(c.members[0].due_ms, 1_790_000_000_000);
        assert_eq!(c.members[1].member, b"");
        assert_eq!((c.members[1].due_ms, c.members[1].attempt), (5, 2));
        let bad = reply(
            0,
            b"",
            3,
            (0, 0),
            vec![
                BulkString(b"a".to_vec()),
                BulkString(b"1.5e3".to_vec()),
                Int(1),
            ],
        );
        assert!(parse_claim(bad, false).is_err());
    }

    #[test]
    fn settle_calls_are_bounded_in_members_and_bytes() {
        let small: Vec<Vec<u8>> = (0..4500).map(|i| vec![0u8; i % 3]).collect();
        let groups = vec![
            (7u16, small.iter().collect::<Vec<_>>()),
            (9, vec![&small[0]]),
        ];
        let split = calls(&groups, |m| m.len());
        let sizes: Vec<usize> = split
            .iter()
            .map(|c| c.iter().map(|(_, ms)| ms.len()).sum())
            .collect();
        assert_eq!(sizes, vec![2000, 2000, 501]);
        // A group split over calls keeps its tag in each part.
        assert!(split[..2].iter().all(|c| c.len() == 1 && c[0].0 == 7));
        assert_eq!(split[2].iter().map(|g| g.0).collect::<Vec<_>>(), vec![7, 9]);
        // 10 KB bodies: about 8 MB per call, far below the query buffer limit.
        let big: Vec<Vec<u8>> = (0..3000).map(|_| vec![0u8; 10_240]).collect();
        let groups = vec![(1u16, big.iter().collect::<Vec<_>>())];
        let split = calls(&groups, |m| m.len());
        assert!(split.len() >= 4);
        for c in &split {
            let bytes: usize = c
                .iter()
                .flat_map(|(_, ms)| ms.iter())
                .map(|m| m.len())
                .sum();
            assert!(bytes <= CALL_BYTES, "{bytes} bytes in one call");
        }
        let total: usize = split
            .iter()
            .flat_map(|c| c.iter())
            .map(|(_, ms)| ms.len())
            .sum();
        assert_eq!(total, 3000);
    }

    #[test]
    fn id_mode_claim_replies_carry_each_body_and_the_dropped_counts() {
        let with_bodies = reply(
            1000,
            b"1000:7",
            7,
            (2, 3),
            vec![
                BulkString(b"id-1".to_vec()),
                Int(900),
                Int(1),
                BulkString(b"body-1".to_vec()),
            ],
        );
        let c = parse_claim(with_bodies, true).unwrap();
        assert_eq!((c.dead_no_body, c.deduplicated), (2, 3));
        assert_eq!(c.members[0].member, b"id-1");
        assert_eq!(c.members[0].body(), b"body-1");
    }

    #[test]
    fn keyspace_flags_need_k_and_z_or_a() {
        assert!(flags_notify_zsets("Kz"));
        assert!(flags_notify_zsets("AK"));
        assert!(!flags_notify_zsets("Ez"));
        assert!(!flags_notify_zsets("K$"));
    }

    #[test]
    fn plain_keys_get_a_hash_tag() {
        let k = KeyFamily::new("delay:order");
        assert_eq!(k.pending, "delay:order");
        assert_eq!(k.inflight, "{delay:order}:inflight");
        assert_eq!(k.dead, "{delay:order}:dead");
        assert_eq!(k.body, "{delay:order}:body");
        assert_eq!(k.delivered, "{delay:order}:delivered");
    }

    #[test]
    fn tagged_keys_keep_their_tag() {
        let k = KeyFamily::new("delay:{order}:timeout");
        assert_eq!(k.inflight, "delay:{order}:timeout:inflight");
        assert_eq!(k.body, "delay:{order}:timeout:body");
    }
}
