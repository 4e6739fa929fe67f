//! Whether the Redis an intake writes to can do what `replica_ack =
//! "fsynced"` asks: `WAITAOF` came with Redis 7.2 (Valkey has it from its
//! first release). On an older server every intake write would fail with
//! "unknown command" and be retried for ever, taking nothing in; `run` and
//! `check` refuse such a business with one line instead.

use crate::config::intake_settings::ReplicaAck;
use crate::config::Business;
use crate::redis_conn::RedisConn;

/// Why `b`'s intake cannot wait as its settings say on the server behind
/// `conn`, if it cannot: the line `run` refuses to start with and `check`
/// fails with.
pub async fn refusal(conn: &RedisConn, b: &Business) -> Result<Option<String>, redis::RedisError> {
    let Some(intake) = &b.intake else {
        return Ok(None);
    };
    if intake.replica_wait.replicas == 0 || intake.replica_wait.ack != ReplicaAck::Fsynced {
        return Ok(None);
    }
    let mut c = conn.clone();
    // One entry per name asked for: nil for a command the server lacks.
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("WAITAOF")
        .query_async(&mut c)
        .await?;
    Ok(matches!(info.first(), None | Some(redis::Value::Nil)).then(|| {
        "intake.replica_ack = \"fsynced\" needs WAITAOF (Redis 7.2 or later, or Valkey), which this Redis lacks: every intake write would fail; set replica_ack = \"received\" (WAIT) or upgrade Redis".to_string()
    }))
}
