//! Dead members addressed by name, for filters that pick some of them (one
//! member, a reason) rather than the oldest.

use super::{Store, StoreError};
use crate::redis_conn::scripts::{DEAD_PURGE, DEAD_REQUEUE};

impl Store {
    /// Whether `member` is in the dead set.
    pub async fn is_dead(&self, member: &[u8]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&self.keys.dead)
            .arg(member)
            .query_async(&mut conn)
            .await?;
        Ok(score.is_some())
    }

    /// How many members the dead set holds.
    pub async fn dead_count(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("ZCARD")
            .arg(&self.keys.dead)
            .query_async(&mut conn)
            .await?)
    }

    /// Moves the named members that are dead back to pending, due now;
    /// returns how many moved. Pass at most a few thousand per call.
    pub async fn dead_requeue_members(&self, members: &[&[u8]]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        let mut inv = DEAD_REQUEUE.prepare_invoke();
        inv.key(&self.keys.pending)
            .key(&self.keys.dead)
            .key(&self.keys.reasons)
            .key(&self.keys.meta)
            .arg(members.len())
            .arg(self.unit.millis());
        for m in members {
            inv.arg(*m);
        }
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Deletes the named members that are dead; returns how many went.
    /// Pass at most a few thousand per call.
    pub async fn dead_purge_members(&self, members: &[&[u8]]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        let mut inv = DEAD_PURGE.prepare_invoke();
        inv.key(&self.keys.dead)
            .key(&self.keys.reasons)
            .key(&self.keys.pending)
            .key(&self.keys.inflight)
            .key(&self.keys.body)
            .arg(members.len());
        for m in members {
            inv.arg(*m);
        }
        Ok(inv.invoke_async(&mut conn).await?)
    }
}
