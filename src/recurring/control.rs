//! An operator's hand on one schedule: pause it, resume it, run it once
//! now. The state lives beside the schedules' own in `{K}:schedules`,
//! under fields no schedule name can take (names never hold `@`), so the
//! writer's one `HGETALL` per pass reads every pause with no command of
//! its own, on every instance, and a restart finds it where it was.

use crate::config::recurring_section::Schedule;
use crate::config::Business;
use crate::keys::KeyFamily;
use crate::redis_conn::{scripts, RedisConn};
use crate::store::StoreError;

/// The key family a business's schedules write to: its first key's.
pub fn family(business: &Business) -> KeyFamily {
    KeyFamily::new(&business.keys().into_iter().next().unwrap_or_default())
}

/// `business`'s schedule key family, and a connection of the caller's own
/// to send to it (a command needs it mutable; the shared one is a clone).
pub fn keys_and_conn(conn: &RedisConn, business: &Business) -> (KeyFamily, RedisConn) {
    (family(business), conn.clone())
}

/// What a pause or resume changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Toggled {
    /// False when the schedule was paused already (pause) or not paused
    /// (resume).
    pub changed: bool,
    /// Occurrences written ahead that the pause took back.
    pub taken_back: u64,
}

/// Pauses `s` on every instance, recording `by`: the occurrences written
/// ahead are taken back and no instance writes another until it resumes.
pub async fn pause(
    conn: &RedisConn,
    business: &Business,
    s: &Schedule,
    by: &str,
) -> Result<Toggled, StoreError> {
    toggle(conn, business, s, "pause", by).await
}

/// Resumes `s`: occurrences after now are written again; those that fell
/// in the pause are neither delivered nor counted missed.
pub async fn resume(
    conn: &RedisConn,
    business: &Business,
    s: &Schedule,
) -> Result<Toggled, StoreError> {
    toggle(conn, business, s, "resume", "").await
}

async fn toggle(
    conn: &RedisConn,
    business: &Business,
    s: &Schedule,
    op: &str,
    by: &str,
) -> Result<Toggled, StoreError> {
    let (keys, mut conn) = keys_and_conn(conn, business);
    let (changed, taken_back): (i64, i64) = scripts::SCHEDULE_PAUSE
        .key(&keys.pending)
        .key(&keys.body)
        .key(&keys.schedules)
        .key(&keys.occurrences)
        .arg(op)
        .arg(&s.name)
        .arg(by)
        .invoke_async(&mut conn)
        .await?;
    Ok(Toggled {
        changed: changed == 1,
        taken_back: taken_back.max(0) as u64,
    })
}

/// One extra occurrence, due now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunNow {
    /// Its id, `SCHEDULE@run-<epoch ms>`: apart from the regular
    /// occurrences, so it neither replaces one nor is taken back by a change.
    pub id: String,
    /// When it is due (now, on Redis's clock).
    pub due_ms: i64,
}

/// Writes one occurrence of `s` due now, with the schedule's body and
/// routing key, delivered like any other (a paused business holds it).
pub async fn run_now(
    conn: &RedisConn,
    business: &Business,
    s: &Schedule,
) -> Result<RunNow, StoreError> {
    let (keys, mut conn) = keys_and_conn(conn, business);
    let now = crate::tasks::redis_now_ms(&mut conn).await?;
    let id = format!("{}@run-{now}", s.name);
    let body = super::writer::body_of(business, &keys, s, &id, now);
    let score = crate::tasks::score_of(now, business.score_unit);
    // The body first, in one MULTI, so no claim sees the id without it.
    redis::pipe()
        .atomic()
        .hset(&keys.body, &id, body)
        .ignore()
        .cmd("ZADD")
        .arg(&keys.pending)
        .arg("NX")
        .arg(score)
        .arg(&id)
        .ignore()
        .query_async::<()>(&mut conn)
        .await?;
    Ok(RunNow { id, due_ms: now })
}
