//! The Redis calls behind bulk actions: a page of a sorted set after a
//! (score, member) cursor, a bounded `ZSCAN` by prefix, and one batch of
//! named members cancelled, moved or checked for their dead reason. Each
//! call touches at most the batch it is given.

use super::{bytes_of, Store, StoreError};
use crate::redis_conn::scripts::{BULK_CANCEL, LIST};

/// Which of a family's sorted sets a page reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// Pending members, by due time.
    Pending,
    /// Dead members, by when they died.
    Dead,
}

/// A page of members with their scores as Redis printed them (exact, for
/// a cursor), and whether more lie in range.
pub type Scored = (Vec<(Vec<u8>, String)>, bool);

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

    /// Up to `n` members of `set` with scores in `lo..=hi` (Redis's bounds:
    /// `-inf`, `+inf` or a number), after the cursor (`("", [])`: from the
    /// start), in Redis's order (`list.lua`).
    pub async fn page_after(
        &self,
        set: Set,
        (lo, hi): (&str, &str),
        n: usize,
        (score, member): (&str, &[u8]),
    ) -> Result<Scored, StoreError> {
        let key = match set {
            Set::Pending => self.pending_set(),
            Set::Dead => &self.keys.dead,
        };
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = LIST
            .key(key)
            .arg(lo)
            .arg(hi)
            .arg(n.max(1))
            .arg(score)
            .arg(member)
            .invoke_async(&mut conn)
            .await?;
        let more = matches!(reply.first(), Some(redis::Value::Int(1)));
        let mut out = Vec::new();
        for pair in reply.get(1..).unwrap_or_default().chunks(2) {
            if let [m, s] = pair {
                let s = String::from_utf8_lossy(&bytes_of(s)?).into_owned();
                out.push((bytes_of(m)?, s));
            }
        }
        Ok((out, more))
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

    /// One `ZSCAN` of the pending set from `cursor`, for members matching
    /// the glob `pattern`, looking at about `count` members.
    pub async fn scan_pending(
        &self,
        cursor: u64,
        pattern: &[u8],
        count: usize,
    ) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
        let mut conn = self.conn.clone();
        let (next, items): (u64, Vec<(Vec<u8>, f64)>) = redis::cmd("ZSCAN")
            .arg(self.pending_set())
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await?;
        Ok((next, items.into_iter().map(|(m, _)| m).collect()))
    }

    /// The dead reasons of `members` (`None` for one not dead).
    pub async fn reasons_of(&self, members: &[&[u8]]) -> Result<Vec<Option<String>>, StoreError> {
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&self.keys.reasons);
        for m in members {
            cmd.arg(*m);
        }
        Ok(cmd.query_async(&mut conn).await?)
    }

    /// Cancels the named members that are pending; returns how many went.
    pub async fn cancel_members(&self, members: &[&[u8]]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let mut inv = BULK_CANCEL.prepare_invoke();
        let k = &self.keys;
        inv.key(self.pending_set())
            .key(&k.inflight)
            .key(&k.dead)
            .key(&k.body);
        inv.arg(if self.member.is_id() { "1" } else { "0" });
        for m in members {
            inv.arg(*m);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Moves the named members that are pending to `due_ms` (`ZADD XX CH`):
    /// one claimed meanwhile is not re-added. Returns how many moved (one
    /// already due then is not counted). In a tenant's set the tenant's
    /// index entry is lowered to it in the same transaction, so an earlier
    /// due time is claimed on time.
    pub async fn move_members(&self, members: &[&[u8]], due_ms: i64) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let score = due_ms as f64 / self.unit.millis() as f64;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("ZADD")
            .arg(self.pending_set())
            .arg("XX")
            .arg("CH");
        for m in members {
            pipe.arg(score).arg(*m);
        }
        if let Some((t, _)) = &self.tenant {
            pipe.cmd("ZADD")
                .arg(self.keys.tenant_index())
                .arg("XX")
                .arg("LT")
                .arg(score)
                .arg(t)
                .ignore();
        }
        let mut conn = self.conn.clone();
        let (moved,): (u64,) = pipe.query_async(&mut conn).await?;
        Ok(moved)
    }
}
