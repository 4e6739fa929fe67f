//! Writing messages taken in from outside to Redis (id mode): intake
//! messages, one `intake.lua` call per shard per batch (more only for very
//! large messages), and what `delayd adopt` moves out of the plugin
//! (`adopt_*.lua`), each followed, when the intake's settings ask for
//! replicas, by `WAIT` (or `WAITAOF`) in the same pipeline.
//!
//! `WAIT` counts the replicas that hold the replication offset of the
//! calling connection's last write, so it must follow the write on the
//! connection that made it: one pipeline keeps the two together through
//! reconnections (a reconnected client has no last write, and its `WAIT`
//! would answer at once), and in Cluster mode sends both to the node of
//! the keys' slot. `WAIT` also blocks its connection until it answers:
//! an intake that waits has a connection of its own, never the one the
//! scanners use. A call that too few replicas acknowledged is attempted
//! again under the same name, and then only waited for (`intake.lua`).

use std::time::Duration;

use redis::{Cmd, Value};

use crate::redis_conn::scripts;

use crate::config::{Business, ScoreUnit};
use crate::redis_conn::RedisConn;
use crate::store::{KeyFamily, StoreError};

use crate::config::intake_settings::{ReplicaAck, ReplicaWait, DEFAULT_TENANT};

/// Most message bytes in one script call, far below Redis's query buffer
/// limit; a larger message goes in a call of its own.
const CALL_BYTES: usize = 8 << 20;

/// The least time a call's marker lives after each attempt.
const MARKER_TTL: Duration = Duration::from_secs(60);

/// When one message is due.
#[derive(Debug, Clone, PartialEq)]
pub enum Due {
    /// No delay (missing, zero or negative): published at once.
    Now,
    /// This many milliseconds after it reaches delayd.
    After(i64),
    /// At this wall-clock time, epoch ms (`x-opt-delivery-time`).
    At(i64),
    /// The header that decides is there but not a number: published at
    /// once, and counted. Names the header and the value.
    Invalid(String),
}

/// One message, ready to store.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its id: the producer's `message_id`, or one delayd assigned.
    pub id: Vec<u8>,
    /// When it is due.
    pub due: Due,
    /// What `{K}:body` holds for it.
    pub envelope: Vec<u8>,
    /// Why it goes straight to the dead set (it can never be published as
    /// it is), if it does.
    pub dead: Option<String>,
    /// Its tenant, on a business with tenants (docs/tenants.md); ignored
    /// by a business without.
    pub tenant: Option<Vec<u8>>,
}

/// What one call stored.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Redis's clock when it stored them, epoch ms.
    pub at_ms: i64,
    /// Re-publishes of a message already stored under its id.
    pub absorbed: u64,
    /// Different messages with an id already taken, stored under a derived id.
    pub renamed: u64,
}

/// Why a write did not store a call as the settings require.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Redis refused it or did not answer.
    #[error(transparent)]
    Redis(#[from] StoreError),
    /// The master stored it, but fewer replicas than `replicas` said they
    /// hold it within `replica_timeout`: a failover now could lose it.
    #[error("the master stored it, but {got} of the {wanted} replicas the intake waits for (intake.replicas) {} within {}", .ack.verb(), humantime::format_duration(*.timeout))]
    Unreplicated {
        /// Replicas that answered.
        got: u32,
        /// Replicas the settings ask for.
        wanted: u32,
        /// How long it waited.
        timeout: Duration,
        /// What they were asked to do with it.
        ack: ReplicaAck,
    },
}

impl ReplicaAck {
    fn verb(&self) -> &'static str {
        match self {
            ReplicaAck::Received => "received it",
            ReplicaAck::Fsynced => "fsynced it to their append-only file",
        }
    }
}

/// Stores intake messages of one business, each on the shard its id hashes to.
#[derive(Clone)]
pub struct Writer {
    conn: RedisConn,
    keys: Vec<String>,
    unit: ScoreUnit,
    wait: ReplicaWait,
    tenants: bool,
}

impl Writer {
    /// A writer for `business`'s keys over `conn`: one of its own when the
    /// intake waits for replicas (see the module's note).
    pub fn new(conn: RedisConn, business: &Business) -> Self {
        Self {
            conn,
            keys: business.keys(),
            unit: business.score_unit,
            tenants: business.tenants.is_some(),
            wait: business
                .intake
                .as_ref()
                .map(|i| i.replica_wait)
                .unwrap_or(ReplicaWait {
                    replicas: 0,
                    timeout: Duration::from_secs(1),
                    ack: ReplicaAck::Received,
                }),
        }
    }

    /// Splits `batch` into calls: by shard, then by [`CALL_BYTES`]. Each
    /// call is a list of indexes into `batch`, in order, so the later of
    /// two messages with one id still wins.
    pub fn calls(&self, batch: &[Item]) -> Vec<(usize, Vec<usize>)> {
        split(&self.keys, batch)
    }

    /// Runs one call made by [`Writer::calls`]; `call` names it in every
    /// attempt, so that an attempt after one the master ran but too few
    /// replicas acknowledged waits again instead of storing again (see
    /// `intake.lua`).
    pub async fn write(
        &self,
        shard: usize,
        items: &[usize],
        batch: &[Item],
        call: u64,
    ) -> Result<Stored, WriteError> {
        let keys = KeyFamily::new(&self.keys[shard]);
        let waits = self.wait.replicas > 0;
        let (tenants, slots) = self.tenants_of(items, batch);
        let tenant_keys = if tenants.is_empty() {
            0
        } else {
            1 + tenants.len()
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::INTAKE.get_hash())
            .arg(4 + tenant_keys + usize::from(waits))
            .arg(&keys.pending)
            .arg(&keys.body)
            .arg(&keys.dead)
            .arg(&keys.reasons);
        if !tenants.is_empty() {
            cmd.arg(keys.tenant_index());
            for t in &tenants {
                cmd.arg(keys.tenant_set(t));
            }
        }
        if waits {
            cmd.arg(crate::keys::helper_key(
                &keys.pending,
                &format!("intake:{call:016x}"),
            ));
        }
        cmd.arg(self.unit.millis())
            .arg(self.marker_ttl().as_millis() as u64)
            .arg(tenants.len());
        for t in &tenants {
            cmd.arg(t.as_slice());
        }
        for (&i, slot) in items.iter().zip(slots) {
            let item = &batch[i];
            cmd.arg(item.id.as_slice())
                .arg(item.when())
                .arg(item.envelope.as_slice())
                .arg(slot);
        }
        let (at_ms, absorbed, renamed) = self.run(cmd).await?;
        Ok(Stored {
            at_ms,
            absorbed,
            renamed,
        })
    }

    /// On a business with tenants, the distinct tenants `items` name (an
    /// item naming none goes to [`DEFAULT_TENANT`]) and each item's place
    /// among them, from 1; without tenants none, and 0 (`K`) for each.
    fn tenants_of(&self, items: &[usize], batch: &[Item]) -> (Vec<Vec<u8>>, Vec<usize>) {
        if !self.tenants {
            return (Vec::new(), vec![0; items.len()]);
        }
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut place = std::collections::HashMap::new();
        let slots = items
            .iter()
            .map(|&i| {
                let t = batch[i]
                    .tenant
                    .clone()
                    .unwrap_or_else(|| DEFAULT_TENANT.as_bytes().to_vec());
                *place.entry(t.clone()).or_insert_with(|| {
                    names.push(t);
                    names.len()
                })
            })
            .collect();
        (names, slots)
    }

    /// The keys this writer stores to, one per shard.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Its connection, for reads beside its writes.
    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Runs one storing script (an `EVALSHA` whose reply is three
    /// integers), then waits for replicas as the settings ask: the reply.
    /// Shared by the intake (`intake.lua`) and adoption (`adopt_*.lua`).
    pub async fn run(&self, cmd: Cmd) -> Result<(i64, u64, u64), WriteError> {
        let mut conn = self.conn.clone();
        if self.wait.replicas == 0 {
            // A server without the script (restarted, promoted) says
            // NOSCRIPT in the reply, which the connection does not retry.
            let reply = match cmd.query_async(&mut conn).await {
                Err(e) if e.code() == Some("NOSCRIPT") => match scripts::eval_for(&cmd) {
                    Some(eval) => eval.query_async(&mut conn).await,
                    None => Err(e),
                },
                other => other,
            };
            return Ok(reply.map_err(StoreError::from)?);
        }
        let (reply, got) = self.write_and_wait(&mut conn, cmd).await?;
        if got < self.wait.replicas {
            return Err(WriteError::Unreplicated {
                got,
                wanted: self.wait.replicas,
                timeout: self.wait.timeout,
                ack: self.wait.ack,
            });
        }
        Ok(reply)
    }

    /// The script and the wait in one pipeline (as `EVAL` when the server
    /// does not have the script): what it stored, and how many replicas
    /// hold it.
    async fn write_and_wait(
        &self,
        conn: &mut RedisConn,
        script: Cmd,
    ) -> Result<((i64, u64, u64), u32), StoreError> {
        let mut replies = self.pipeline(conn, script.clone()).await?;
        if matches!(&replies[0], Value::ServerError(e) if e.code() == "NOSCRIPT") {
            let eval = scripts::eval_for(&script)
                .ok_or_else(|| StoreError::Reply("storing script not registered".into()))?;
            replies = self.pipeline(conn, eval).await?;
        }
        let mut replies = replies.into_iter();
        let (Some(stored), Some(waited)) = (replies.next(), replies.next()) else {
            return Err(StoreError::Reply("a pipeline of two answered fewer".into()));
        };
        let reply =
            redis::from_redis_value(stored.extract_error()?).map_err(redis::RedisError::from)?;
        let waited = waited.extract_error()?;
        let got: i64 = match self.wait.ack {
            ReplicaAck::Received => redis::from_redis_value(waited),
            // WAITAOF answers [local fsyncs, replica fsyncs].
            ReplicaAck::Fsynced => redis::from_redis_value::<(i64, i64)>(waited).map(|(_, r)| r),
        }
        .map_err(redis::RedisError::from)?;
        Ok((reply, got.clamp(0, u32::MAX as i64) as u32))
    }

    /// How long a call's marker outlives its last attempt: far longer than
    /// the pause between two attempts (the backoff, at most 2 s, and one
    /// replica wait).
    fn marker_ttl(&self) -> Duration {
        MARKER_TTL + self.wait.timeout * 2
    }

    async fn pipeline(&self, conn: &mut RedisConn, script: Cmd) -> Result<Vec<Value>, StoreError> {
        let ms = self.wait.timeout.as_millis().max(1) as u64;
        let mut wait = match self.wait.ack {
            ReplicaAck::Received => redis::cmd("WAIT"),
            ReplicaAck::Fsynced => {
                let mut c = redis::cmd("WAITAOF");
                c.arg(0);
                c
            }
        };
        wait.arg(self.wait.replicas).arg(ms);
        let mut pipe = redis::pipe();
        pipe.ignore_errors().add_command(script).add_command(wait);
        Ok(pipe.query_async(conn).await?)
    }
}

impl Item {
    /// When it is due, as `intake.lua` reads it.
    fn when(&self) -> String {
        if let Some(reason) = &self.dead {
            return format!("!{reason}");
        }
        match self.due {
            Due::After(ms) => format!("+{ms}"),
            Due::At(ms) => format!("@{ms}"),
            Due::Now | Due::Invalid(_) => "0".to_string(),
        }
    }
}

fn split(keys: &[String], batch: &[Item]) -> Vec<(usize, Vec<usize>)> {
    let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); keys.len()];
    for (i, item) in batch.iter().enumerate() {
        let key = crate::keys::shard_of(keys, &item.id);
        let shard = keys.iter().position(|k| k == key).unwrap_or(0);
        by_shard[shard].push(i);
    }
    let mut out = Vec::new();
    for (shard, items) in by_shard.into_iter().enumerate() {
        let mut call = Vec::new();
        let mut bytes = 0;
        for i in items {
            let size = batch[i].envelope.len() + batch[i].id.len() + 32;
            if !call.is_empty() && bytes + size > CALL_BYTES {
                out.push((shard, std::mem::take(&mut call)));
                bytes = 0;
            }
            bytes += size;
            call.push(i);
        }
        if !call.is_empty() {
            out.push((shard, call));
        }
    }
    out
}

/// An id for a message without a `message_id`: 48 bits of the time it
/// arrived (ms) and 48 random bits, in 24 hex digits, so ids sort by
/// arrival and two never meet.
pub fn assign_id() -> Vec<u8> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let random: u64 = rand::random::<u64>() & 0xFFFF_FFFF_FFFF;
    format!("{:012x}{random:012x}", ms & 0xFFFF_FFFF_FFFF).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, size: usize) -> Item {
        Item {
            id: id.as_bytes().to_vec(),
            due: Due::Now,
            envelope: vec![0; size],
            dead: None,
            tenant: None,
        }
    }

    #[test]
    fn a_batch_is_one_call_per_shard_in_order_unless_it_is_huge() {
        let one = vec!["k".to_string()];
        let batch: Vec<Item> = (0..500).map(|i| item(&format!("id-{i}"), 100)).collect();
        let calls = split(&one, &batch);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, (0..500).collect::<Vec<_>>());
        let four: Vec<String> = (0..4).map(|i| format!("k:{i}")).collect();
        let calls = split(&four, &batch);
        assert_eq!(calls.len(), 4);
        for (shard, items) in &calls {
            assert!(items.windows(2).all(|w| w[0] < w[1]), "kept in order");
            for &i in items {
                assert_eq!(crate::keys::shard_of(&four, &batch[i].id), four[*shard]);
            }
        }
        // 3 MB messages: two per call, and one of 20 MB alone.
        let big = vec![
            item("a", 3 << 20),
            item("b", 3 << 20),
            item("c", 3 << 20),
            item("d", 20 << 20),
        ];
        let sizes: Vec<usize> = split(&one, &big).iter().map(|c| c.1.len()).collect();
        assert_eq!(sizes, vec![2, 1, 1]);
    }

    #[test]
    fn assigned_ids_are_24_hex_digits_and_distinct() {
        let a = assign_id();
        let b = assign_id();
        assert_eq!(a.len(), 24);
        assert!(a.iter().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
