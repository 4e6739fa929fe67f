//! Dead members of a business, over all its shards: list them, count and
//! then requeue or purge all of them, one, or those whose reason matches.
//! `delayd dead` and the API both go through here.

use super::Merge;
use crate::store::{DeadMember, DeadOp, DeadPick, Glimpse, Store, StoreError};

/// Members one script call moves or deletes, so no call holds Redis long.
const CHUNK: usize = 1000;
/// Dead members a reason filter reads at most per request, over all the
/// business's shards together; beyond it the answer says it is partial.
pub const REASON_SCAN_LIMIT: usize = 100_000;

/// Which dead members an action applies to.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Every dead member (oldest first, up to the action's limit).
    All,
    /// This one member (the id in id mode, the body in body mode).
    Member(Vec<u8>),
    /// The member longer than a glimpse a listing showed: when it died
    /// (its score in the dead set) and its SHA-1.
    Digest {
        /// Its score, as the listing gave it.
        died: String,
        /// Its SHA-1 in hex.
        digest: String,
    },
    /// Those whose reason contains this text.
    Reason(String),
}

/// What to do with the members a filter picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back to pending, due now, attempts reset.
    Requeue,
    /// Deleted for good.
    Purge,
}

impl Action {
    fn op(self) -> DeadOp {
        match self {
            Action::Requeue => DeadOp::Requeue,
            Action::Purge => DeadOp::Purge,
        }
    }

    /// `requeue` or `purge`, as answers and the audit log name it.
    pub fn name(self) -> &'static str {
        match self {
            Action::Requeue => "requeue",
            Action::Purge => "purge",
        }
    }
}

/// How many members a filter picked, or an action acted on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Matched {
    /// Members counted, or moved or deleted.
    pub count: u64,
    /// True when a reason filter stopped after [`REASON_SCAN_LIMIT`]
    /// members: more may match.
    pub partial: bool,
}

/// The oldest `limit` dead members over every shard, and Redis's clock.
/// Shards are read a little at a time, so the members read are about the
/// ones returned plus one per shard, and no call copies much more than
/// 8 MiB of members in Redis however large they are.
pub async fn list(stores: &[Store], limit: usize) -> Result<(i64, Vec<DeadMember>), StoreError> {
    let mut now = 0;
    let mut merge = Merge::new(
        stores.len(),
        limit.max(1),
        |a: &DeadMember, b: &DeadMember| {
            a.died_ms
                .total_cmp(&b.died_ms)
                .then_with(|| a.member.cmp(&b.member))
        },
    );
    while let Some((shard, n)) = merge.wants() {
        let (at, members, short) = stores[shard].dead_page(merge.read(shard), n).await?;
        now = now.max(at);
        let more = members.len() == n || short;
        merge.fill(shard, members, more);
    }
    Ok((now, merge.finish().0))
}

/// How many dead members `filter` picks.
pub async fn count(stores: &[Store], filter: &Filter) -> Result<Matched, StoreError> {
    let mut out = Matched::default();
    let mut budget = REASON_SCAN_LIMIT;
    for store in stores {
        let n = match filter {
            Filter::All => store.dead_count().await?,
            Filter::Member(m) => store.is_dead(m).await? as u64,
            Filter::Digest { died, digest } => {
                let pick = DeadPick::Digest { died, digest };
                store.dead_act(DeadOp::Count, pick, 1).await?.n
            }
            Filter::Reason(r) => {
                let (n, partial) =
                    with_reason(store, DeadOp::Count, r, usize::MAX, &mut budget).await?;
                out.partial |= partial;
                n
            }
        };
        out.count += n;
    }
    Ok(out)
}

/// Applies `action` to at most `limit` of the dead members `filter` picks.
pub async fn apply(
    stores: &[Store],
    filter: &Filter,
    action: Action,
    limit: usize,
) -> Result<Matched, StoreError> {
    let mut out = Matched::default();
    let mut left = limit;
    let mut budget = REASON_SCAN_LIMIT;
    let op = action.op();
    for store in stores {
        if left == 0 {
            break;
        }
        let n = match filter {
            Filter::All => oldest(store, op, left).await?,
            Filter::Member(m) => {
                store
                    .dead_act(op, DeadPick::Named(&[m.as_slice()]), 1)
                    .await?
                    .n
            }
            Filter::Digest { died, digest } => {
                store
                    .dead_act(op, DeadPick::Digest { died, digest }, 1)
                    .await?
                    .n
            }
            Filter::Reason(r) => {
                let (n, partial) = with_reason(store, op, r, left, &mut budget).await?;
                out.partial |= partial;
                n
            }
        };
        out.count += n;
        left = left.saturating_sub(n as usize);
    }
    Ok(out)
}

/// The oldest `limit` members, in chunks.
async fn oldest(store: &Store, op: DeadOp, limit: usize) -> Result<u64, StoreError> {
    let mut total = 0u64;
    let mut left = limit;
    while left > 0 {
        let chunk = left.min(CHUNK);
        let n = store.dead_act(op, DeadPick::Oldest, chunk).await?.n;
        total += n;
        left -= n as usize;
        if (n as usize) < chunk {
            break;
        }
    }
    Ok(total)
}

/// Applies `op` to at most `most` members of `store`'s dead set whose
/// reason contains `text`, reading at most `budget` members (and taking
/// them from it), a chunk per script call; true when it stopped before
/// the end.
async fn with_reason(
    store: &Store,
    op: DeadOp,
    text: &str,
    most: usize,
    budget: &mut usize,
) -> Result<(u64, bool), StoreError> {
    let mut n = 0u64;
    let mut after = (String::new(), Glimpse::whole(Vec::new()));
    while *budget > 0 && (n as usize) < most {
        let read = CHUNK.min(*budget);
        let pick = DeadPick::Reason {
            text,
            after: (&after.0, &after.1),
            read,
        };
        let step = store.dead_act(op, pick, most - n as usize).await?;
        *budget -= read;
        n += step.n;
        match step.last {
            Some(last) if step.more => after = last,
            _ => return Ok((n, false)),
        }
    }
    Ok((n, *budget == 0))
}
