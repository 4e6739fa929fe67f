//! What the console and `delayd recurring --state` show of each schedule:
//! its definition, its next occurrences, whether it is paused, how many
//! it missed, and the latest one delivered. Read on demand: `TIME`, one
//! `HGETALL` of `{K}:schedules` and one pipeline of `ZSCORE`s (three per
//! recent occurrence looked at), whatever the number of occurrences.

use std::collections::HashMap;

use chrono::TimeZone;

use super::control::keys_and_conn;
use super::notes::{last_field, missed_field, paused_field};
use super::occurrences::{between, latest_at_or_before};
use crate::config::recurring_section::Schedule;
use crate::config::Business;
use crate::redis_conn::RedisConn;
use crate::store::{Paused, StoreError};

/// Recent occurrences looked at, newest first, for the latest delivered.
const LOOK_BACK: usize = 3;

/// One occurrence, by id and due time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Occurrence {
    /// `SCHEDULE@<epoch ms>`.
    pub id: String,
    /// When it is (was) due, epoch ms.
    pub due_ms: i64,
    /// The due time in the schedule's zone, e.g. `2026-11-25 02:30:00 CET`.
    pub local: String,
}

/// Where the latest occurrence due by now is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastDue {
    /// The occurrence.
    #[serde(flatten)]
    pub occurrence: Occurrence,
    /// `pending` (due, not yet claimed), `in_flight`, `dead`, or
    /// `delivered` (written and gone from all three).
    pub state: &'static str,
}

/// One schedule as shown.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleState {
    /// The schedule's name.
    pub name: String,
    /// Its cron expression, as configured.
    pub cron: String,
    /// Its IANA zone.
    pub tz: String,
    /// `none`, `last` or `all`.
    pub catch_up: String,
    /// How far ahead occurrences are written, ms.
    pub write_ahead_ms: u64,
    /// The next occurrences after now, oldest first.
    pub next: Vec<Occurrence>,
    /// Set while an operator has paused it.
    pub paused: Option<Paused>,
    /// Occurrences missed while no instance ran and skipped by `catch_up`,
    /// counted by every instance since the schedule was first written.
    pub missed: u64,
    /// The latest occurrence due by now (of those written), and where it is.
    pub last_due: Option<LastDue>,
    /// The latest occurrence written, due by now and gone from pending, in
    /// flight and dead: delivered.
    pub last_delivered: Option<Occurrence>,
}

/// Each schedule of `business` with `count` next occurrences, and Redis's
/// clock when read.
pub async fn states(
    conn: &RedisConn,
    business: &Business,
    count: usize,
) -> Result<(i64, Vec<ScheduleState>), StoreError> {
    let (keys, mut conn) = keys_and_conn(conn, business);
    let now = crate::tasks::redis_now_ms(&mut conn).await?;
    let notes: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&keys.schedules)
        .query_async(&mut conn)
        .await?;
    let recent: Vec<Vec<Occurrence>> = business
        .recurring
        .iter()
        .map(|s| recent_written(s, &notes, now))
        .collect();
    let mut pipe = redis::pipe();
    for o in recent.iter().flatten() {
        pipe.zscore(&keys.pending, &o.id)
            .zscore(&keys.inflight, &o.id)
            .zscore(&keys.dead, &o.id);
    }
    let scores: Vec<Option<f64>> = if recent.iter().all(Vec::is_empty) {
        Vec::new()
    } else {
        pipe.query_async(&mut conn).await?
    };
    let mut scores = scores.chunks(3);
    let mut out = Vec::new();
    for (s, recent) in business.recurring.iter().zip(recent) {
        let mut last_due = None;
        let mut last_delivered = None;
        for o in recent {
            let state = match scores.next() {
                Some([Some(_), _, _]) => "pending",
                Some([_, Some(_), _]) => "in_flight",
                Some([_, _, Some(_)]) => "dead",
                _ => "delivered",
            };
            if last_due.is_none() {
                last_due = Some(LastDue {
                    occurrence: o.clone(),
                    state,
                });
            }
            if state == "delivered" && last_delivered.is_none() {
                last_delivered = Some(o);
            }
        }
        out.push(ScheduleState {
            name: s.name.clone(),
            cron: s.cron_text.clone(),
            tz: s.tz.name().to_string(),
            catch_up: format!("{:?}", s.catch_up).to_lowercase(),
            write_ahead_ms: s.write_ahead.as_millis() as u64,
            next: between(s, now, i64::MAX, count)
                .into_iter()
                .map(|t| occurrence(s, t))
                .collect(),
            paused: notes
                .get(&paused_field(&s.name))
                .and_then(|v| Paused::parse(v)),
            missed: notes
                .get(&missed_field(&s.name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            last_due,
            last_delivered,
        });
    }
    Ok((now, out))
}

/// The occurrence of `s` due at `ms`, with its local time.
pub fn occurrence(s: &Schedule, ms: i64) -> Occurrence {
    let local =
        s.tz.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.format("%Y-%m-%d %H:%M:%S %Z").to_string())
            .unwrap_or_default();
    Occurrence {
        id: format!("{}@{ms}", s.name),
        due_ms: ms,
        local,
    }
}

/// Up to [`LOOK_BACK`] occurrences of `s` due by `now` and no later than
/// the latest written, newest first; none before the first write.
fn recent_written(s: &Schedule, notes: &HashMap<String, String>, now: i64) -> Vec<Occurrence> {
    let Some(last) = notes
        .get(&last_field(&s.name))
        .and_then(|v| v.parse::<i64>().ok())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = last.min(now);
    while out.len() < LOOK_BACK {
        let Some(t) = latest_at_or_before(s, at) else {
            break;
        };
        out.push(occurrence(s, t));
        at = t - 1;
    }
    out
}
