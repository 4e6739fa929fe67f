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
            Set::Pending => &self.keys.pending,
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
            .arg(&self.keys.pending)
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
            .arg(&self.keys.pending)
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
        inv.key(&k.pending)
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
    /// already due then is not counted).
    pub async fn move_members(&self, members: &[&[u8]], due_ms: i64) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let score = due_ms as f64 / self.unit.millis() as f64;
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&self.keys.pending).arg("XX").arg("CH");
        for m in members {
            cmd.arg(score).arg(*m);
        }
        let mut conn = self.conn.clone();
        Ok(cmd.query_async(&mut conn).await?)
    }
}
