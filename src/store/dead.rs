//! Dead members picked and acted on in Redis: the oldest, named ones, one
//! a listing showed by its glimpse, or those whose reason matches, so no
//! member has to leave Redis for an action or a count.

use redis::ScriptInvocation;

use super::{int_of, Glimpse, Store, StoreError};
use crate::redis_conn::scripts::{DEAD_MATCH, DEAD_PURGE, DEAD_REQUEUE};

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

    /// Requeues, purges or counts (`op`) at most `most` of the dead
    /// members `pick` picks, in one script call.
    pub async fn dead_act(
        &self,
        op: DeadOp,
        pick: DeadPick<'_>,
        most: usize,
    ) -> Result<DeadStep, StoreError> {
        let k = &self.keys;
        let mut inv = match op {
            DeadOp::Requeue => {
                let mut inv = DEAD_REQUEUE.prepare_invoke();
                inv.key(&k.pending)
                    .key(&k.dead)
                    .key(&k.reasons)
                    .key(&k.meta);
                inv.arg(most).arg(self.unit.millis());
                inv
            }
            DeadOp::Purge => {
                let mut inv = DEAD_PURGE.prepare_invoke();
                inv.key(&k.dead).key(&k.reasons).key(&k.pending);
                inv.key(&k.inflight).key(&k.body).arg(most);
                inv
            }
            DeadOp::Count => {
                let mut inv = DEAD_MATCH.prepare_invoke();
                inv.key(&k.dead).key(&k.reasons).arg(most);
                inv
            }
        };
        pick.args(&mut inv);
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        let mut it = reply.into_iter();
        let n = int_of(it.next())? as u64;
        let more = matches!(it.next(), Some(redis::Value::Int(1)));
        let last = Glimpse::read_last(&mut it)?;
        Ok(DeadStep { n, more, last })
    }
}

/// What a dead-set script does with the members it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadOp {
    /// Back to pending, due now, attempts reset.
    Requeue,
    /// Deleted for good.
    Purge,
    /// Counted only.
    Count,
}

/// Which dead members a script picks (prelude.lua's `dead_picked`).
#[derive(Debug, Clone, Copy)]
pub enum DeadPick<'a> {
    /// The oldest.
    Oldest,
    /// These, those of them that are dead.
    Named(&'a [&'a [u8]]),
    /// The member a listing showed by its glimpse: when it died (its
    /// score) and its SHA-1.
    Digest {
        /// Its score in the dead set, as a listing gave it.
        died: &'a str,
        /// Its SHA-1 in hex.
        digest: &'a str,
    },
    /// Those after the cursor whose reason contains `text`, reading at
    /// most `read` members.
    Reason {
        /// Text the reason contains.
        text: &'a str,
        /// The last member read before and its score (`""` from the start).
        after: (&'a str, &'a Glimpse),
        /// Most members to read.
        read: usize,
    },
}

impl DeadPick<'_> {
    fn args(&self, inv: &mut ScriptInvocation<'_>) {
        match self {
            DeadPick::Oldest => inv.arg("oldest"),
            DeadPick::Named(members) => {
                inv.arg("named");
                for m in *members {
                    inv.arg(*m);
                }
                inv
            }
            DeadPick::Digest { died, digest } => inv.arg("digest").arg(*died).arg(*digest),
            DeadPick::Reason { text, after, read } => inv
                .arg("reason")
                .arg(*text)
                .arg(after.0)
                .arg(&after.1.head)
                .arg(after.1.digest_arg())
                .arg(*read),
        };
    }
}

/// What a dead-set script did.
#[derive(Debug, Clone, Default)]
pub struct DeadStep {
    /// Members requeued, purged or counted.
    pub n: u64,
    /// A reason pick: whether more members lie after the last one read.
    pub more: bool,
    /// A reason pick: the last member read and its score (the next cursor).
    pub last: Option<(String, Glimpse)>,
}
