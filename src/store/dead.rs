//! Dead members addressed by name, for filters that pick some of them (one
//! member, a reason) rather than the oldest.

use redis::ScriptInvocation;

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

    /// Moves up to `limit` dead members back to pending, due now.
    pub async fn dead_requeue(&self, limit: usize) -> Result<u64, StoreError> {
        self.run_dead(self.requeue_call(limit), &[]).await
    }

    /// Deletes up to `limit` dead members.
    pub async fn dead_purge(&self, limit: usize) -> Result<u64, StoreError> {
        self.run_dead(self.purge_call(limit), &[]).await
    }

    /// Moves the named members that are dead back to pending, due now;
    /// returns how many moved. Pass at most a few thousand per call.
    pub async fn dead_requeue_members(&self, members: &[&[u8]]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        self.run_dead(self.requeue_call(members.len()), members)
            .await
    }

    /// Deletes the named members that are dead; returns how many went.
    /// Pass at most a few thousand per call.
    pub async fn dead_purge_members(&self, members: &[&[u8]]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        self.run_dead(self.purge_call(members.len()), members).await
    }

    /// `dead_requeue.lua` with its keys, the most members to move and the
    /// clock's unit; named members follow, or none for the oldest.
    fn requeue_call(&self, most: usize) -> ScriptInvocation<'static> {
        let mut inv = DEAD_REQUEUE.prepare_invoke();
        let k = &self.keys;
        inv.key(&k.pending)
            .key(&k.dead)
            .key(&k.reasons)
            .key(&k.meta);
        inv.arg(most).arg(self.unit.millis());
        inv
    }

    /// `dead_purge.lua` with its keys and the most members to delete; named
    /// members follow, or none for the oldest.
    fn purge_call(&self, most: usize) -> ScriptInvocation<'static> {
        let mut inv = DEAD_PURGE.prepare_invoke();
        let k = &self.keys;
        inv.key(&k.dead).key(&k.reasons).key(&k.pending);
        inv.key(&k.inflight).key(&k.body).arg(most);
        inv
    }

    /// Runs a dead-set script on `members` (none: the oldest dead ones).
    async fn run_dead(
        &self,
        mut inv: ScriptInvocation<'static>,
        members: &[&[u8]],
    ) -> Result<u64, StoreError> {
        for m in members {
            inv.arg(*m);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }
}
