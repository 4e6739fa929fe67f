//! `GET /businesses/{business}/schedules` (each recurring schedule: cron,
//! zone, next occurrences, paused, missed, last delivered) and `POST
//! …/schedules/{schedule}/pause`, `/resume`, `/run` (admin token).

use std::time::Duration;

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::json;

use super::{bounded, count_within, ApiError, Asked, Reply, Shared};
use crate::http::auth::require_admin;
use crate::recurring::{self, control, view};
use crate::tasks::audit::Write;

/// How long a schedules answer is reused, as the overview is.
const REUSE: Duration = Duration::from_secs(1);
/// Most next occurrences one answer lists per schedule.
const MAX_NEXT: usize = 100;

/// Query of `GET …/schedules`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulesQuery {
    /// Next occurrences per schedule (1 to 100; 5 unless set).
    next: Option<usize>,
}

/// Every schedule of the business with its state (an empty list for a
/// business without schedules).
pub async fn list(state: Shared, Asked(name, q): Asked<SchedulesQuery>) -> Reply {
    let next = count_within("next", q.next, 5, MAX_NEXT)?;
    let b = state.business(&name)?.clone();
    let conn = state.conn(&b.name)?;
    let key = cache_key(&b.name, next);
    let v = state
        .overview
        .get_or(&key, REUSE, async move {
            if b.recurring.is_empty() {
                return Ok(json!({ "business": b.name, "now_ms": null, "schedules": [] }));
            }
            let (now, schedules) = bounded(&b.name, view::states(&conn, &b, next)).await?;
            Ok(json!({ "business": b.name, "now_ms": now, "schedules": schedules }))
        })
        .await?;
    Ok(Json(v))
}

fn cache_key(business: &str, next: usize) -> String {
    format!("schedules:{business}:{next}")
}

/// Pauses the schedule on every instance.
pub async fn pause(state: Shared, headers: HeaderMap, Path(p): Path<(String, String)>) -> Reply {
    act(state, headers, p, Act::Pause).await
}

/// Resumes the paused schedule.
pub async fn resume(state: Shared, headers: HeaderMap, Path(p): Path<(String, String)>) -> Reply {
    act(state, headers, p, Act::Resume).await
}

/// Delivers one extra occurrence of the schedule now.
pub async fn run(state: Shared, headers: HeaderMap, Path(p): Path<(String, String)>) -> Reply {
    act(state, headers, p, Act::Run).await
}

#[derive(Clone, Copy)]
enum Act {
    Pause,
    Resume,
    Run,
}

async fn act(state: Shared, headers: HeaderMap, (b, s): (String, String), what: Act) -> Reply {
    let role = require_admin(&state, &headers, &b)?;
    let b = state.business(&b)?;
    let s = recurring::named(b, &s).map_err(ApiError::not_found)?;
    let conn = state.conn(&b.name)?;
    let (action, count, reply) = match what {
        Act::Pause => {
            let t = bounded(&b.name, control::pause(&conn, b, s, role.name())).await?;
            let result = if t.changed {
                "paused"
            } else {
                "paused_already"
            };
            let reply = json!({ "result": result, "taken_back": t.taken_back });
            ("schedule_pause", u64::from(t.changed), reply)
        }
        Act::Resume => {
            let t = bounded(&b.name, control::resume(&conn, b, s)).await?;
            let result = if t.changed { "resumed" } else { "not_paused" };
            (
                "schedule_resume",
                u64::from(t.changed),
                json!({ "result": result }),
            )
        }
        Act::Run => {
            let r = bounded(&b.name, control::run_now(&conn, b, s)).await?;
            let reply = json!({ "result": "due_now", "id": r.id, "due_ms": r.due_ms });
            ("schedule_run", 1, reply)
        }
    };
    state
        .audit(Write {
            by: role.name(),
            business: &b.name,
            action,
            what: &s.name,
            count,
        })
        .await;
    // The page shows the new state at once, not a second later.
    for next in [5, MAX_NEXT] {
        state.overview.forget(&cache_key(&b.name, next));
    }
    let mut reply = reply;
    reply["business"] = b.name.clone().into();
    reply["schedule"] = s.name.clone().into();
    Ok(Json(reply))
}
