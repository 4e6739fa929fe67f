//! Pending tasks: list by due window, look up, search by prefix, schedule,
//! cancel, reschedule and run now, through [`crate::tasks`] as the CLI.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::body_search;
use super::{bounded, handle, member_kind, page_limit, ApiError, Asked, Reply, Shared, Shown};
use crate::config::{Business, MemberMode};
use crate::http::auth::{require_admin, Role};
use crate::http::HttpState;
use crate::tasks::audit::Write;
use crate::tasks::{self, when, Cancelled, Listed, Range, TaskState};

/// Query of `GET /tasks`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only tasks due at or after this time (RFC 3339 or epoch ms).
    from: Option<String>,
    /// Only tasks due at or before this time.
    to: Option<String>,
    /// Tasks per page (1 to 1000; 50 unless set).
    limit: Option<usize>,
    /// The cursor of the previous page.
    cursor: Option<String>,
    /// A business with tenants: only this tenant's tasks.
    tenant: Option<String>,
}

fn time_field(field: &str, v: Option<&str>) -> Result<Option<i64>, ApiError> {
    v.map(|s| when::parse_at(s).map_err(|e| ApiError::bad(format!("\"{field}\" \"{s}\": {e}"))))
        .transpose()
}

/// The due range `from` and `to` give; one that starts after it ends is
/// refused, as it could only ever pick nothing.
pub(super) fn due_range(from: Option<&str>, to: Option<&str>) -> Result<Range, ApiError> {
    Range {
        from_ms: time_field("from", from)?,
        to_ms: time_field("to", to)?,
    }
    .ordered("\"from\"", "\"to\"")
    .map_err(ApiError::bad)
}

/// One page of pending tasks in due order, with `list`'s cursor.
pub async fn list(state: Shared, Asked(name, q): Asked<ListQuery>) -> Reply {
    let b = state.business(&name)?;
    let limit = page_limit(q.limit, 50)?;
    if let Some(c) = &q.cursor {
        if !tasks::valid_cursor(c) {
            return Err(ApiError::bad(format!(
                "\"cursor\" \"{c}\" is not a cursor this API returned; pass the previous page's \"cursor\""
            )));
        }
    }
    let range = due_range(q.from.as_deref(), q.to.as_deref())?;
    tenant_ok(b, q.tenant.as_deref())?;
    let mut conn = state.conn(&b.name)?;
    let now_ms = bounded(&b.name, tasks::redis_now_ms(&mut conn)).await?;
    let page = bounded(
        &b.name,
        tasks::list(
            &mut conn,
            b,
            range,
            limit,
            q.cursor.as_deref(),
            q.tenant.as_deref(),
        ),
    )
    .await?;
    let mut v = page_json(b, &page.tasks, &page.cursor);
    v["now_ms"] = now_ms.into();
    Ok(Json(v))
}

/// A page of pending tasks as the listing and the prefix search answer it:
/// each task as its member (as shown), its handle and its due time, and
/// the cursor to the next page.
fn page_json(b: &Business, tasks: &[Listed], cursor: &Option<String>) -> Value {
    let rows: Vec<Value> = tasks
        .iter()
        .map(|t| {
            json!({
                "member": Shown::of_start(&t.member.head, t.member.size),
                "handle": handle(&t.member, &t.score), "due_ms": t.due_ms,
            })
        })
        .collect();
    json!({ "business": b.name, "member": member_kind(b), "tasks": rows, "cursor": cursor })
}

/// Query of `GET /search`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    /// What members start with.
    prefix: Option<String>,
    /// Id mode: text the task's body contains (instead of `prefix`).
    body: Option<String>,
    /// Matches wanted (1 to 1000; 50 unless set); a page may hold fewer.
    limit: Option<usize>,
    /// Where the previous page stopped.
    cursor: Option<String>,
    /// A business with tenants: only this tenant's tasks (with `prefix`).
    tenant: Option<String>,
}

/// Pending tasks whose member (body, or id) starts with a prefix: one
/// bounded `ZSCAN` walk per page, `partial` while the walk is not over.
pub async fn search(state: Shared, Asked(name, q): Asked<SearchQuery>) -> Reply {
    let b = state.business(&name)?;
    let limit = page_limit(q.limit, 50)?;
    let prefix = match (q.prefix, q.body) {
        (None, Some(_)) if q.tenant.is_some() => {
            return Err(ApiError::bad(
                "\"tenant\" limits a \"prefix\" search; a \"body\" search looks at every body of the business",
            ))
        }
        (None, Some(text)) => {
            return body_search::page(&state, b, &text, limit, q.cursor.as_deref()).await
        }
        (Some(p), None) => p,
        _ => {
            return Err(ApiError::bad(
                "give exactly one of \"prefix\" (what members start with) or \"body\" (text an id-mode body contains)",
            ))
        }
    };
    if prefix.len() > tasks::search::MAX_TEXT {
        return Err(ApiError::bad(format!(
            "\"prefix\" is {} bytes; at most {}",
            prefix.len(),
            tasks::search::MAX_TEXT
        )));
    }
    if let Some(c) = &q.cursor {
        if !tasks::search::valid_cursor(b, c) {
            return Err(ApiError::bad(format!(
                "\"cursor\" \"{c}\" is not a search cursor this API returned"
            )));
        }
    }
    tenant_ok(b, q.tenant.as_deref())?;
    let mut conn = state.conn(&b.name)?;
    let page = bounded(
        &b.name,
        tasks::search::by_prefix(
            &mut conn,
            b,
            prefix.as_bytes(),
            limit,
            q.cursor.as_deref(),
            q.tenant.as_deref(),
        ),
    )
    .await?;
    let mut v = page_json(b, &page.tasks, &page.cursor);
    v["partial"] = page.cursor.is_some().into();
    Ok(Json(v))
}

/// Refuses a `tenant` that cannot name tasks of `b` (no tenants, or not a
/// name producers could write).
fn tenant_ok(b: &Business, tenant: Option<&str>) -> Result<(), ApiError> {
    match tenant.and_then(|t| tasks::tenant_refused(b, t.as_bytes())) {
        Some(why) => Err(ApiError::bad(format!("\"tenant\": {why}"))),
        None => Ok(()),
    }
}

/// The API addresses single tasks by id: in body mode the member is the
/// whole body, which a path cannot carry well.
fn id_mode(b: &Business) -> Result<(), ApiError> {
    match b.member {
        MemberMode::Id { .. } => Ok(()),
        MemberMode::Body => Err(ApiError::bad(format!(
            "business \"{}\" has member = \"body\": its tasks have no id; find them with /search?prefix=, or use the CLI",
            b.name
        ))),
    }
}

/// Where one task is, with its body (cut to a few KiB, with its size).
pub async fn get(
    state: Shared,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let b = state.business(&name)?;
    id_mode(b)?;
    let mut conn = state.conn(&b.name)?;
    let now_ms = bounded(&b.name, tasks::redis_now_ms(&mut conn)).await?;
    let found = bounded(
        &b.name,
        tasks::get(&mut conn, b, id.as_bytes(), Some(tasks::search::BODY_HEAD)),
    )
    .await?;
    let mut v = serde_json::to_value(&found).unwrap_or_default();
    v["business"] = b.name.clone().into();
    v["id"] = id.clone().into();
    v["now_ms"] = now_ms.into();
    if let Some(head) = &found.body {
        let size = found.body_size;
        match crate::message::stored(b, head) {
            Some(e) => {
                let own = size - (head.len() - e.body.len());
                v["body"] = serde_json::to_value(Shown::of_start(e.body, own)).unwrap_or_default();
                v["message"] = crate::message::envelope::describe(&e);
            }
            None => {
                v["body"] = serde_json::to_value(Shown::of_start(head, size)).unwrap_or_default()
            }
        }
    }
    if found.state == TaskState::NotFound {
        v["error"] = format!(
            "id \"{id}\" of business \"{}\": not found (not pending, in flight or dead: delivered, cancelled or never scheduled)",
            b.name
        )
        .into();
        return Ok((StatusCode::NOT_FOUND, Json(v)).into_response());
    }
    Ok(Json(v).into_response())
}

/// When a task is due: exactly one of the three.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// After this long on Redis's clock, e.g. `30s` (`0s`: now).
    #[serde(rename = "in")]
    in_: Option<String>,
    /// At this time: RFC 3339 or epoch ms, as a string.
    at: Option<String>,
    /// At this epoch millisecond.
    at_ms: Option<i64>,
}

impl When {
    /// Whether any of the three was given.
    pub(super) fn given(&self) -> bool {
        self.in_.is_some() || self.at.is_some() || self.at_ms.is_some()
    }

    /// The due time these fields give, on Redis's clock `now_ms`.
    pub(super) fn due_ms(&self, now_ms: i64) -> Result<i64, ApiError> {
        match (&self.in_, &self.at, self.at_ms) {
            (Some(d), None, None) => when::parse_in(d)
                .map(|d| when::after(now_ms, d))
                .map_err(|e| ApiError::bad(format!("\"in\" \"{d}\": {e}"))),
            (None, Some(a), None) => {
                when::parse_at(a).map_err(|e| ApiError::bad(format!("\"at\" \"{a}\": {e}")))
            }
            (None, None, Some(ms)) => Ok(ms),
            _ => Err(ApiError::bad(
                "give exactly one of \"in\" (e.g. \"30s\"), \"at\" (RFC 3339 or epoch ms) or \"at_ms\"",
            )),
        }
    }
}

/// Body of `POST /tasks`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    /// The task id (id mode; required there, refused in body mode).
    id: Option<String>,
    /// The message body, UTF-8 text.
    body: String,
    /// Its tenant, on a business with tenants (the default tenant when
    /// absent); refused on a business without.
    tenant: Option<String>,
    #[serde(flatten)]
    when: When,
}

/// `POST /tasks`'s fixes name the body's `"id"`.
const ID_FIXES: tasks::IdFixes = tasks::IdFixes {
    give_id: "give the task's \"id\"",
    drop_id: "\"id\" does not apply",
};

/// Schedules one task, as `delayd schedule` does.
pub async fn schedule(
    state: Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    req: Result<Json<ScheduleBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let role = require_admin(&state, &headers, &name)?;
    let b = state.business(&name)?;
    let Json(req) = req?;
    tenant_ok(b, req.tenant.as_deref())?;
    if let Some(why) = tasks::id_refused(b, req.id.is_some(), &ID_FIXES) {
        return Err(ApiError::bad(why));
    }
    let (member, body) = match req.id {
        Some(id) if id.is_empty() => {
            return Err(ApiError::bad("\"id\" is empty; give the task an id"))
        }
        Some(id) => (id.into_bytes(), Some(req.body.into_bytes())),
        None => (req.body.into_bytes(), None),
    };
    let mut conn = state.conn(&b.name)?;
    let now_ms = bounded(&b.name, tasks::redis_now_ms(&mut conn)).await?;
    let due_ms = req.when.due_ms(now_ms)?;
    let key = bounded(
        &b.name,
        tasks::schedule(
            &mut conn,
            b,
            &member,
            body.as_deref(),
            req.tenant.as_deref().map(str::as_bytes),
            due_ms,
        ),
    )
    .await?;
    let mut v = json!({
        "business": b.name, "key": key, "due_ms": due_ms,
        "bytes": body.as_ref().unwrap_or(&member).len(),
    });
    let what = if b.member.is_id() {
        let id = crate::text::text(&member);
        v["id"] = id.clone().into();
        format!("id \"{id}\"")
    } else {
        format!("a body of {} bytes", member.len())
    };
    state
        .audit(Write {
            by: role.name(),
            business: &b.name,
            action: "schedule",
            what: &what,
            count: 1,
        })
        .await;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

/// Cancels one pending task: 200 when cancelled, 409 while in flight, 404
/// when dead or not pending (the CLI's exit codes 0, 3 and 4).
pub async fn cancel(w: IdWrite) -> Result<Response, ApiError> {
    let (b, id) = (&w.b, &w.id);
    let mut conn = w.state.conn(&b.name)?;
    let (key, outcome) = bounded(&b.name, tasks::cancel(&mut conn, b, id.as_bytes())).await?;
    let count = (outcome == Cancelled::Cancelled) as u64;
    w.audit("cancel", count).await;
    let mut v = json!({ "business": b.name, "id": id, "key": key, "result": outcome });
    let what = format!("id \"{id}\" of business \"{}\"", b.name);
    let status = match outcome {
        Cancelled::Cancelled => StatusCode::OK,
        Cancelled::InFlight => {
            v["error"] = format!("{what}: in flight: delivery under way, not cancelled").into();
            StatusCode::CONFLICT
        }
        Cancelled::Dead => {
            v["error"] =
                format!("{what}: not pending: it is dead; purge it from the dead set").into();
            StatusCode::NOT_FOUND
        }
        Cancelled::NotFound => {
            v["error"] =
                format!("{what}: not pending: delivered, cancelled already or never scheduled")
                    .into();
            StatusCode::NOT_FOUND
        }
    };
    Ok((status, Json(v)).into_response())
}

/// Moves one pending task to a new due time.
pub async fn reschedule(
    w: IdWrite,
    req: Result<Json<When>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = req?;
    let due_ms = req.due_ms(redis_now(&w.state, &w.b).await?)?;
    moved(w, "reschedule", due_ms).await
}

/// Makes one pending task due now, on Redis's clock.
pub async fn run_now(w: IdWrite) -> Result<Response, ApiError> {
    let now_ms = redis_now(&w.state, &w.b).await?;
    moved(w, "run_now", now_ms).await
}

/// Redis's clock, epoch ms, from the server that holds `b`.
async fn redis_now(state: &Shared, b: &Business) -> Result<i64, ApiError> {
    let mut conn = state.conn(&b.name)?;
    bounded(&b.name, tasks::redis_now_ms(&mut conn)).await
}

/// A write on one task by id (`…/tasks/{id}`): the business, the id and
/// the caller, read from the request's parts once the caller is the
/// business's admin and the business is in id mode, so that a refusal
/// answers before any body is read.
pub(super) struct IdWrite {
    state: Shared,
    role: Role,
    b: Business,
    id: String,
}

impl FromRequestParts<Arc<HttpState>> for IdWrite {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<HttpState>) -> Result<Self, Response> {
        let Path((name, id)) = Path::<(String, String)>::from_request_parts(parts, s)
            .await
            .map_err(IntoResponse::into_response)?;
        let state = State(s.clone());
        let (role, b) =
            admin_by_id(&state, &parts.headers, &name).map_err(IntoResponse::into_response)?;
        let b = b.clone();
        Ok(Self { state, role, b, id })
    }
}

/// The caller's role and the business, which must be in id mode.
fn admin_by_id<'a>(
    state: &'a Shared,
    headers: &HeaderMap,
    name: &str,
) -> Result<(Role, &'a Business), ApiError> {
    let role = require_admin(state, headers, name)?;
    let b = state.business(name)?;
    id_mode(b)?;
    Ok((role, b))
}

impl IdWrite {
    /// Logs the write as `action` to the audit log; `count` is 1 when it
    /// took.
    async fn audit(&self, action: &str, count: u64) {
        self.state
            .audit(Write {
                by: self.role.name(),
                business: &self.b.name,
                action,
                what: &format!("id \"{}\"", self.id),
                count,
            })
            .await;
    }
}

/// Reschedules the task to `due_ms`; when it is not pending, says where it is
/// (409 in flight, 404 dead or gone), as `delayd reschedule` does; the
/// audit log names `action` and who asked.
async fn moved(w: IdWrite, action: &str, due_ms: i64) -> Result<Response, ApiError> {
    let (b, id) = (&w.b, &w.id);
    let mut conn = w.state.conn(&b.name)?;
    let key = bounded(
        &b.name,
        tasks::reschedule(&mut conn, b, id.as_bytes(), due_ms),
    )
    .await?;
    w.audit(action, key.is_some() as u64).await;
    if let Some(key) = key {
        return Ok(Json(json!({
            "business": b.name, "id": id, "result": "rescheduled", "key": key, "due_ms": due_ms,
        }))
        .into_response());
    }
    let state_now = bounded(&b.name, tasks::get(&mut conn, b, id.as_bytes(), Some(0)))
        .await?
        .state;
    let what = format!("id \"{id}\" of business \"{}\"", b.name);
    let (status, result, error) = match state_now {
        TaskState::InFlight { .. } => (
            StatusCode::CONFLICT,
            "in_flight",
            format!("{what}: in flight: delivery under way, not moved"),
        ),
        TaskState::Dead { .. } => (
            StatusCode::NOT_FOUND,
            "dead",
            format!("{what}: not pending: it is dead; requeue it from the dead set"),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "{what}: not pending: delivered, cancelled or never scheduled; schedule it anew"
            ),
        ),
    };
    Ok((
        status,
        Json(json!({ "business": b.name, "id": id, "result": result, "error": error })),
    )
        .into_response())
}
