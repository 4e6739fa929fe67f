//! The Redis calls behind bulk actions on pending members: one batch
//! picked (a due range after a cursor, or a `ZSCAN` step by prefix) and
//! cancelled or moved in the same script call (`bulk_pending.lua`), so no
//! member leaves Redis; and counts. Each call touches at most its batch.

use super::{int_of, Glimpse, Store, StoreError};
use crate::redis_conn::scripts::{BULK_PENDING, SCAN_GLIMPSE};

/// Which pending members one batch picks.
#[derive(Debug, Clone, Copy)]
pub enum PendingPick<'a> {
    /// Scores in `lo..=hi` (Redis's bounds), after `after` (a score as
    /// Redis printed it, `""` from the start, and the member there).
    Due {
        /// Lowest score.
        lo: &'a str,
        /// Highest score.
        hi: &'a str,
        /// The cursor: the last member read and its score.
        after: (&'a str, &'a Glimpse),
    },
    /// One `ZSCAN` step from `cursor` for members matching `pattern`.
    Prefix {
        /// The `ZSCAN` cursor (0 to start).
        cursor: u64,
        /// The `MATCH` glob.
        pattern: &'a [u8],
        /// The `COUNT` hint.
        count: usize,
    },
}

/// What one batch does to the members it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingAct {
    /// Cancel them.
    Cancel,
    /// Move them to this due time, epoch ms.
    Move(i64),
}

/// What one batch did, and where the next starts.
#[derive(Debug, Clone, Default)]
pub struct PendingStep {
    /// Members cancelled or moved.
    pub n: u64,
    /// Whether the set holds more after this batch.
    pub more: bool,
    /// A due pick: the last member read and its score (the next cursor).
    pub last: Option<(String, Glimpse)>,
    /// A prefix pick: the next `ZSCAN` cursor (0: the walk is over).
    pub next_scan: u64,
    /// A prefix pick: the matches the step copied in Redis and their
    /// bytes, to size the next step's `COUNT`.
    pub copied: (usize, usize),
}

impl Store {
    /// This store with `tenant`'s set as its pending set, for the bulk
    /// calls below (a move also lowers the tenant's index entry); only
    /// those calls are meant for it.
    pub fn in_tenant(&self, tenant: &str) -> Store {
        let set = String::from_utf8_lossy(&self.keys.tenant_set(tenant.as_bytes())).into_owned();
        let mut s = self.clone();
        s.tenant = Some((tenant.to_string(), set));
        s
    }

    /// The sets this key's pending tasks wait in, as stores for the bulk
    /// calls, in name order: `tenant`'s set when one is named; else `K`
    /// and, with tenants, the sets of the first `most` tenants of the index.
    pub async fn pending_stores(
        &self,
        tenant: Option<&str>,
        most: usize,
    ) -> Result<Vec<Store>, StoreError> {
        if let Some(t) = tenant {
            return Ok(vec![self.in_tenant(t)]);
        }
        let mut out = vec![self.clone()];
        if self.tenants {
            let mut conn = self.conn.clone();
            let names = super::indexed(&mut conn, &self.keys.pending, most).await?;
            out.extend(names.iter().map(|t| self.in_tenant(&t.name)));
        }
        Ok(out)
    }

    /// The tenant whose set this store's pending set is, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_ref().map(|(t, _)| t.as_str())
    }

    /// The set the bulk calls read as pending: `K`, or the tenant's.
    fn pending_set(&self) -> &str {
        self.tenant
            .as_ref()
            .map_or(&self.keys.pending, |(_, set)| set)
    }

    /// Pending members in `lo..=hi` (scores), counted by `ZCOUNT`.
    pub async fn count_due(&self, lo: &str, hi: &str) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("ZCOUNT")
            .arg(self.pending_set())
            .arg(lo)
            .arg(hi)
            .query_async(&mut conn)
            .await?)
    }

    /// Cancels or moves at most `most` of the pending members `pick`
    /// picks, in one script call (`bulk_pending.lua`).
    pub async fn bulk_pending(
        &self,
        pick: PendingPick<'_>,
        act: PendingAct,
        most: usize,
    ) -> Result<PendingStep, StoreError> {
        let k = &self.keys;
        let mut inv = BULK_PENDING.prepare_invoke();
        inv.key(self.pending_set())
            .key(&k.inflight)
            .key(&k.dead)
            .key(&k.body)
            .key(k.tenant_index());
        inv.arg(if self.member.is_id() { "1" } else { "0" });
        match act {
            PendingAct::Cancel => inv.arg("cancel"),
            PendingAct::Move(due_ms) => inv.arg(due_ms as f64 / self.unit.millis() as f64),
        };
        inv.arg(self.tenant().unwrap_or("")).arg(most.max(1));
        match pick {
            PendingPick::Due { lo, hi, after } => {
                inv.arg("due").arg(lo).arg(hi).arg(after.0);
                inv.arg(&after.1.head).arg(after.1.digest_arg())
            }
            PendingPick::Prefix {
                cursor,
                pattern,
                count,
            } => inv.arg("prefix").arg(cursor).arg(pattern).arg(count),
        };
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        let mut it = reply.into_iter();
        let n = int_of(it.next())? as u64;
        if let PendingPick::Prefix { .. } = pick {
            let next_scan = int_of(it.next())? as u64;
            let bytes = int_of(it.next())?.max(0) as usize;
            let matches = int_of(it.next())?.max(0) as usize;
            return Ok(PendingStep {
                n,
                more: next_scan != 0,
                next_scan,
                copied: (matches, bytes),
                ..PendingStep::default()
            });
        }
        let more = int_of(it.next())? == 1;
        let last = Glimpse::read_last(&mut it)?;
        Ok(PendingStep {
            n,
            more,
            last,
            ..PendingStep::default()
        })
    }

    /// One `ZSCAN` step of the pending set from `cursor`, for members
    /// matching the glob `pattern`, looking at about `count`: the next
    /// cursor, how many matched and their bytes (no member leaves Redis).
    pub async fn count_matching(
        &self,
        cursor: u64,
        pattern: &[u8],
        count: usize,
    ) -> Result<(u64, u64, usize), StoreError> {
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = SCAN_GLIMPSE
            .key(self.pending_set())
            .arg(cursor)
            .arg(pattern)
            .arg(count)
            .arg("count")
            .invoke_async(&mut conn)
            .await?;
        let mut it = reply.into_iter();
        let next = int_of(it.next())? as u64;
        let bytes = int_of(it.next())?.max(0) as usize;
        Ok((next, int_of(it.next())? as u64, bytes))
    }
}
