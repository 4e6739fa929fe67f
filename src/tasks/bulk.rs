//! Bulk actions on a filtered set: cancel or reschedule pending tasks by
//! due range or member prefix, requeue or purge dead members by reason.
//!
//! The flow is count ([`count`]), confirm that count, act ([`step`]). A
//! step touches at most [`PER_STEP`] members, in batches of [`BATCH`] (one
//! bounded Redis call each), never more than the count confirmed, and
//! returns a cursor to resume from: no call walks a huge set at once, and
//! a set that grew since the count is not acted on beyond it.

use std::time::{Duration, Instant};

use super::dead::{self, Filter, Matched};
use super::step_size::StepSize;
use super::tenant_sets::{resume_at, SetAt, MOST_TENANTS};
use super::{glimpse_of, hex, score_of, Range};
use crate::config::ScoreUnit;
use crate::store::{DeadOp, DeadPick, Glimpse, PendingAct, PendingPick, Store, StoreError};

/// Members one Redis call reads or acts on.
pub const BATCH: usize = 1000;
/// Members one step acts on at most.
pub const PER_STEP: usize = 10_000;
/// Longest a step keeps starting batches.
pub const STEP_TIME: Duration = Duration::from_secs(2);
/// `ZSCAN` calls a prefix count makes at most, over every shard (each
/// looks at about [`BATCH`] members); beyond it the count is partial.
pub const COUNT_SCANS: usize = 100;

/// Which members a bulk action picks.
#[derive(Debug, Clone)]
pub enum Pick {
    /// Pending tasks due within the range.
    Due(Range),
    /// Pending tasks whose member (the id in id mode) starts with this.
    Prefix(Vec<u8>),
    /// Dead members whose reason contains this text.
    Reason(String),
}

impl Pick {
    /// The filter as the audit log names it.
    pub fn describe(&self) -> String {
        let at = |ms: Option<i64>| ms.map_or("any time".to_string(), |ms| format!("{ms}"));
        match self {
            Pick::Due(r) => format!("due from {} to {} (epoch ms)", at(r.from_ms), at(r.to_ms)),
            Pick::Prefix(p) => format!("member prefix \"{}\"", crate::text::text(p)),
            Pick::Reason(r) => format!("reason containing \"{r}\""),
        }
    }
}

/// What the audit log and the answers say a bulk action picked (and, for
/// a reschedule, where to).
pub fn describe(pick: &Pick, act: Act, tenant: Option<&str>) -> String {
    let mut what = pick.describe();
    if let Some(t) = tenant {
        what.push_str(&format!(
            " of tenant \"{}\"",
            crate::text::text(t.as_bytes())
        ));
    }
    if let Act::Reschedule(ms) = act {
        what.push_str(&format!(", to {ms}"));
    }
    what
}

/// Why `tenant` cannot limit a bulk action picking `pick` on `business`:
/// the business has no tenants, the name is not one, or the action is on
/// dead members, which are kept per business.
pub fn tenant_refused(
    business: &crate::config::Business,
    pick: &Pick,
    tenant: Option<&str>,
) -> Option<String> {
    let t = tenant?;
    if matches!(pick, Pick::Reason(_)) {
        return Some(
            "dead members are kept per business, not per tenant: leave the tenant out".into(),
        );
    }
    super::tenant_refused(business, t.as_bytes())
}

/// What a bulk action does to the members it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Pending tasks removed (in-flight ones go ahead).
    Cancel,
    /// Pending tasks moved to this due time, epoch ms.
    Reschedule(i64),
    /// Dead members back to pending, due now.
    Requeue,
    /// Dead members deleted.
    Purge,
}

impl Act {
    /// The action as answers and the audit log name it.
    pub fn name(self) -> &'static str {
        match self {
            Act::Cancel => "bulk_cancel",
            Act::Reschedule(_) => "bulk_reschedule",
            Act::Requeue => "bulk_requeue",
            Act::Purge => "bulk_purge",
        }
    }

    /// Whether the action applies to what `pick` picks: pending tasks are
    /// cancelled or moved, dead members requeued or purged.
    pub fn fits(self, pick: &Pick) -> bool {
        matches!(
            (self, pick),
            (
                Act::Cancel | Act::Reschedule(_),
                Pick::Due(_) | Pick::Prefix(_)
            ) | (Act::Requeue | Act::Purge, Pick::Reason(_))
        )
    }
}

/// Where a bulk action acts: a business's stores (one per key), its score
/// unit, and the one tenant it is limited to. A business with tenants and
/// no tenant named is acted on in each key's `K` and the sets of the first
/// [`MOST_TENANTS`] tenants of its index.
#[derive(Clone, Copy)]
pub struct Scope<'a> {
    /// One store per key of the business.
    pub stores: &'a [Store],
    /// How its scores count time.
    pub unit: ScoreUnit,
    /// Only this tenant's sets.
    pub tenant: Option<&'a str>,
}

impl Scope<'_> {
    /// The sets `pick` walks: [`Scope::sets`] for pending tasks; each
    /// key's alone for dead members, which are kept per key.
    async fn sets_for(&self, pick: &Pick) -> Result<Vec<(SetAt, Store)>, StoreError> {
        if !matches!(pick, Pick::Reason(_)) {
            return self.sets().await;
        }
        let at = |shard| SetAt {
            shard,
            tenant: None,
        };
        Ok(self
            .stores
            .iter()
            .enumerate()
            .map(|(i, s)| (at(i), s.clone()))
            .collect())
    }

    /// The sets pending tasks wait in, named, in order.
    async fn sets(&self) -> Result<Vec<(SetAt, Store)>, StoreError> {
        let mut out = Vec::new();
        for (shard, store) in self.stores.iter().enumerate() {
            for s in store.pending_stores(self.tenant, MOST_TENANTS).await? {
                let tenant = s.tenant().map(str::to_string);
                out.push((SetAt { shard, tenant }, s));
            }
        }
        Ok(out)
    }
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// Members cancelled, moved, requeued or purged by this step.
    pub touched: u64,
    /// Pass to the next step; `None` once the set was walked to its end or
    /// the confirmed count was reached.
    pub cursor: Option<String>,
}

/// Where a walk stands in one shard.
#[derive(Debug, Clone, PartialEq)]
enum Pos {
    Start,
    /// After this (score, member), in Redis's order.
    After(String, Glimpse),
    /// At this `ZSCAN` cursor.
    Scan(u64),
}

/// A walk: members still allowed, the set, where in it.
#[derive(Debug, Clone, PartialEq)]
struct Cursor {
    left: u64,
    at: SetAt,
    pos: Pos,
}

impl Cursor {
    fn encode(&self) -> String {
        let pos = match &self.pos {
            Pos::Start => String::new(),
            Pos::After(s, m) => match &m.digest {
                None => format!("a{s}:{}", hex(&m.head)),
                Some(d) => format!("a{s}:{}:{d}", hex(&m.head)),
            },
            Pos::Scan(z) => format!("z{z}"),
        };
        format!("{}:{}:{pos}", self.left, self.at.encode())
    }

    fn decode(c: &str, shards: usize) -> Option<Self> {
        let mut parts = c.splitn(3, ':');
        let left = parts.next()?.parse().ok()?;
        let at = SetAt::decode(parts.next()?, shards)?;
        let p = parts.next()?;
        let pos = if p.is_empty() {
            Pos::Start
        } else if let Some(z) = p.strip_prefix('z') {
            Pos::Scan(z.parse().ok()?)
        } else {
            let (s, m) = p.strip_prefix('a')?.split_once(':')?;
            s.parse::<f64>().ok()?;
            Pos::After(s.to_string(), glimpse_of(m)?)
        };
        Some(Self { left, at, pos })
    }
}

/// Whether `c` is a cursor a step over `shards` shards could have returned.
pub fn valid_cursor(c: &str, shards: usize) -> bool {
    Cursor::decode(c, shards).is_some()
}

/// How many members `pick` picks now: exact for a due range (`ZCOUNT`),
/// bounded for a prefix ([`COUNT_SCANS`]) or a reason (as `dead` counts),
/// `partial` when the bound was reached first.
pub async fn count(scope: Scope<'_>, pick: &Pick) -> Result<Matched, StoreError> {
    let mut out = Matched::default();
    match pick {
        Pick::Reason(r) => return dead::count(scope.stores, &Filter::Reason(r.clone())).await,
        Pick::Due(r) => {
            let (lo, hi) = bounds(*r, scope.unit);
            for (_, s) in &scope.sets().await? {
                out.count += s.count_due(&lo, &hi).await?;
            }
        }
        Pick::Prefix(p) => {
            let pattern = super::search::pattern(p);
            let mut calls = 0;
            let mut size = StepSize::up_to(BATCH);
            'sets: for (_, s) in &scope.sets().await? {
                let mut at = 0;
                loop {
                    if calls == COUNT_SCANS {
                        out.partial = true;
                        break 'sets;
                    }
                    calls += 1;
                    let (next, found, bytes) = s.count_matching(at, &pattern, size.count()).await?;
                    size.saw(found as usize, bytes);
                    out.count += found;
                    at = next;
                    if at == 0 {
                        break;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A due range as Redis score bounds.
fn bounds(r: Range, unit: ScoreUnit) -> (String, String) {
    let at = |ms: Option<i64>, open: &str| {
        ms.map_or(open.to_string(), |ms| format!("{}", score_of(ms, unit)))
    };
    (at(r.from_ms, "-inf"), at(r.to_ms, "+inf"))
}

/// Acts on the next members `pick` picks, from `cursor` (`None`: a new
/// action, allowed to touch `confirmed` members in all), for at most
/// [`PER_STEP`] members or [`STEP_TIME`]. A Redis failure mid-step leaves
/// whole batches done; the count so far is lost to the answer, not to Redis.
pub async fn step(
    scope: Scope<'_>,
    pick: &Pick,
    act: Act,
    cursor: Option<&str>,
    confirmed: u64,
) -> Result<Step, StoreError> {
    let mut at = match cursor {
        Some(c) => Cursor::decode(c, scope.stores.len()).ok_or_else(|| {
            StoreError::Reply(format!("bulk cursor \"{c}\" is not one delayd returned"))
        })?,
        None => Cursor {
            left: confirmed,
            at: SetAt::default(),
            pos: Pos::Start,
        },
    };
    let sets = scope.sets_for(pick).await?;
    let names: Vec<SetAt> = sets.iter().map(|(a, _)| a.clone()).collect();
    let (mut i, same) = resume_at(&names, &at.at);
    if !same {
        at.pos = Pos::Start;
    }
    let started = Instant::now();
    let mut touched = 0u64;
    let mut size = StepSize::up_to(BATCH);
    while at.left > 0
        && i < sets.len()
        && (touched as usize) < PER_STEP
        && started.elapsed() < STEP_TIME
    {
        let room = at.left.min((PER_STEP - touched as usize) as u64) as usize;
        let (n, done) = batch(
            &sets[i].1,
            scope.unit,
            (pick, act),
            (&mut at.pos, &mut size),
            room,
        )
        .await?;
        touched += n;
        at.left -= n.min(at.left);
        if done {
            i += 1;
            at.pos = Pos::Start;
        }
    }
    let cursor = match sets.get(i) {
        Some((set, _)) if at.left > 0 => {
            at.at = set.clone();
            Some(at.encode())
        }
        _ => None,
    };
    Ok(Step { touched, cursor })
}

/// One batch on one set: at most [`BATCH`] members read (a prefix pick's
/// as many as `size` says) and at most `room` acted on, in one script
/// call. Returns how many were touched and whether the set was walked to
/// its end.
async fn batch(
    store: &Store,
    unit: ScoreUnit,
    (pick, act): (&Pick, Act),
    (pos, size): (&mut Pos, &mut StepSize),
    room: usize,
) -> Result<(u64, bool), StoreError> {
    let start = Glimpse::whole(Vec::new());
    let after = match pos {
        Pos::After(s, m) => (s.as_str(), &*m),
        _ => ("", &start),
    };
    let on = match act {
        Act::Reschedule(due_ms) => PendingAct::Move(due_ms),
        _ => PendingAct::Cancel,
    };
    let (n, more, last) = match pick {
        Pick::Due(r) => {
            let (lo, hi) = bounds(*r, unit);
            let pick = PendingPick::Due {
                lo: &lo,
                hi: &hi,
                after,
            };
            let step = store.bulk_pending(pick, on, BATCH.min(room)).await?;
            (step.n, step.more, step.last)
        }
        Pick::Prefix(p) => {
            let pick = PendingPick::Prefix {
                cursor: if let Pos::Scan(z) = pos { *z } else { 0 },
                pattern: &super::search::pattern(p),
                count: size.count().min(room.max(10)),
            };
            let step = store.bulk_pending(pick, on, room).await?;
            size.saw(step.copied.0, step.copied.1);
            *pos = Pos::Scan(step.next_scan);
            return Ok((step.n, step.next_scan == 0));
        }
        Pick::Reason(text) => {
            let op = match act {
                Act::Purge => DeadOp::Purge,
                _ => DeadOp::Requeue,
            };
            let pick = DeadPick::Reason {
                text,
                after,
                read: BATCH,
            };
            let step = store.dead_act(op, pick, room).await?;
            (step.n, step.more, step.last)
        }
    };
    if let Some((s, m)) = last {
        *pos = Pos::After(s, m);
    }
    Ok((n, !more))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_name_a_shard_that_exists() {
        for c in [
            Cursor {
                left: 5,
                at: SetAt {
                    shard: 1,
                    tenant: None,
                },
                pos: Pos::Start,
            },
            Cursor {
                left: 7,
                at: SetAt {
                    shard: 0,
                    tenant: Some("acme:eu/1".into()),
                },
                pos: Pos::Scan(42),
            },
            Cursor {
                left: 9,
                at: SetAt {
                    shard: 1,
                    tenant: None,
                },
                pos: Pos::After("1767323045000".into(), Glimpse::whole(b"a:\xff".to_vec())),
            },
            Cursor {
                left: 3,
                at: SetAt {
                    shard: 0,
                    tenant: None,
                },
                // A longer member: its start and SHA-1 (a cursor does not
                // carry its size).
                pos: Pos::After(
                    "12".into(),
                    Glimpse {
                        head: vec![b'x'; Glimpse::BYTES],
                        size: 0,
                        digest: Some("ab".repeat(20)),
                    },
                ),
            },
        ] {
            assert_eq!(Cursor::decode(&c.encode(), 2), Some(c));
        }
        assert!(!valid_cursor("5:2:", 2));
        assert!(!valid_cursor("x:0:", 2));
        assert!(!valid_cursor("5:0:anope:zz", 2));
        assert!(!valid_cursor("5:0:q", 2));
        assert!(!valid_cursor("5:0/zz:", 2));
        assert!(!valid_cursor("5:2/61:", 2));
    }

    #[test]
    fn pending_actions_take_pending_picks_and_dead_actions_dead_ones() {
        let due = Pick::Due(Range::default());
        let reason = Pick::Reason("x".into());
        assert!(Act::Cancel.fits(&due) && Act::Reschedule(0).fits(&Pick::Prefix(b"a".to_vec())));
        assert!(Act::Purge.fits(&reason) && !Act::Purge.fits(&due) && !Act::Cancel.fits(&reason));
    }
}
