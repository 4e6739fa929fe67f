//! `POST /businesses/{business}/bulk/{action}`: cancel or reschedule
//! pending tasks by due range or member prefix, requeue or purge dead
//! members by reason. Count first (`dry_run`, a read), then act with
//! `confirm` set to that count (a write): each call acts on at most a
//! bounded number of members and returns a `cursor` to go on from, and
//! writes one audit entry with its filter and how many it touched.

use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::json;

use super::tasks::{due_range, When};
use super::{bounded, bounded_by, ApiError, Reply, Shared};
use crate::http::auth::{require_admin, require_read};
use crate::tasks::audit::Write;
use crate::tasks::bulk::{self, Act, Pick, Scope};
use crate::tasks::redis_now_ms;

/// Longest prefix or reason text, in bytes.
const MAX_TEXT: usize = 1024;

/// Body of a bulk action.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    /// Pending tasks due at or after this time (RFC 3339 or epoch ms).
    from: Option<String>,
    /// Pending tasks due at or before this time.
    to: Option<String>,
    /// Pending tasks whose member (the id in id mode) starts with this.
    prefix: Option<String>,
    /// Dead members whose reason contains this.
    reason: Option<String>,
    /// Reschedule: the new due time.
    #[serde(flatten)]
    when: When,
    /// Count, do not act.
    #[serde(default)]
    dry_run: bool,
    /// The count a dry run returned: the action touches at most this many.
    confirm: Option<u64>,
    /// The previous call's `cursor`: go on where it stopped.
    cursor: Option<String>,
    /// A business with tenants: only this tenant's pending tasks.
    tenant: Option<String>,
}

impl BulkBody {
    /// The members this body picks for `action`, or why it is refused.
    fn pick(&self, action: &str) -> Result<Pick, ApiError> {
        let range = self.from.is_some() || self.to.is_some();
        let dead = matches!(action, "requeue" | "purge");
        let long = |f: &str, v: &str| {
            (v.len() > MAX_TEXT)
                .then(|| ApiError::bad(format!("\"{f}\" is {} bytes; at most {MAX_TEXT}", v.len())))
        };
        match (range, &self.prefix, &self.reason) {
            (false, None, Some(r)) if dead => {
                if r.is_empty() {
                    return Err(ApiError::bad("\"reason\" is empty; give text the dead reasons contain"));
                }
                long("reason", r).map_or(Ok(Pick::Reason(r.clone())), Err)
            }
            (true, None, None) if !dead => Ok(Pick::Due(due_range(
                self.from.as_deref(),
                self.to.as_deref(),
            )?)),
            (false, Some(p), None) if !dead => {
                if p.is_empty() {
                    return Err(ApiError::bad("\"prefix\" is empty; give the start of the members, or a due range"));
                }
                long("prefix", p).map_or(Ok(Pick::Prefix(p.clone().into_bytes())), Err)
            }
            _ if dead => Err(ApiError::bad(format!(
                "{action} picks dead members by \"reason\" (text the reasons contain), and nothing else"
            ))),
            _ => Err(ApiError::bad(format!(
                "{action} picks pending tasks by a due range (\"from\" and/or \"to\") or by \"prefix\", one of the two"
            ))),
        }
    }
}

/// Counts, or acts on, the members a filter picks.
pub async fn act(
    state: Shared,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    req: Result<Json<BulkBody>, JsonRejection>,
) -> Reply {
    let b = state.business(&name)?;
    let Json(req) = req?;
    if !matches!(
        action.as_str(),
        "cancel" | "reschedule" | "requeue" | "purge"
    ) {
        return Err(ApiError::not_found(format!(
            "no bulk action \"{action}\": the actions are cancel, reschedule (pending tasks), requeue and purge (dead members)"
        )));
    }
    let pick = req.pick(&action)?;
    if let Some(why) = bulk::tenant_refused(b, &pick, req.tenant.as_deref()) {
        return Err(ApiError::bad(format!("\"tenant\": {why}")));
    }
    if action == "reschedule" && (req.when.given() || !req.dry_run) {
        // Checked when counting too: a dry run must not pass what the act refuses.
        req.when.due_ms(0)?;
    }
    let role = if req.dry_run {
        require_read(&state, &headers, Some(&b.name))?
    } else {
        require_admin(&state, &headers, &b.name)?
    };
    let stores = state.stores_of(&b.name)?;
    let scope = Scope {
        stores: &stores,
        unit: b.score_unit,
        tenant: req.tenant.as_deref(),
    };
    if req.dry_run {
        let n = bounded(&b.name, bulk::count(scope, &pick)).await?;
        return Ok(Json(json!({
            "business": b.name, "action": action, "dry_run": true,
            "count": n.count, "partial": n.partial,
            "filter": bulk::describe(&pick, Act::Cancel, scope.tenant),
        })));
    }
    let act = match action.as_str() {
        "cancel" => Act::Cancel,
        "requeue" => Act::Requeue,
        "purge" => Act::Purge,
        _ => {
            let mut conn = state.conn(&b.name)?;
            let now_ms = bounded(&b.name, redis_now_ms(&mut conn)).await?;
            Act::Reschedule(req.when.due_ms(now_ms)?)
        }
    };
    let confirmed = match (&req.cursor, req.confirm) {
        (Some(c), _) if !bulk::valid_cursor(c, stores.len()) => {
            return Err(ApiError::bad(format!(
                "\"cursor\" \"{c}\" is not a cursor this API returned; pass the previous call's \"cursor\""
            )))
        }
        (Some(_), _) => 0,
        (None, Some(n)) if n > 0 => n,
        (None, Some(_)) => return Err(ApiError::bad("\"confirm\" is 0: there is nothing to act on")),
        (None, None) => {
            return Err(ApiError::bad(
                "give \"confirm\": the count a dry run returned (\"dry_run\": true counts first)",
            ))
        }
    };
    let done = bounded_by(
        std::time::Duration::from_secs(30),
        &b.name,
        bulk::step(scope, &pick, act, req.cursor.as_deref(), confirmed),
    )
    .await?;
    let mut what = bulk::describe(&pick, act, scope.tenant);
    if req.cursor.is_some() {
        what.push_str(" (resumed)");
    }
    state
        .audit(Write {
            by: role.name(),
            business: &b.name,
            action: act.name(),
            what: &what,
            count: done.touched,
        })
        .await;
    state.overview.forget("overview");
    Ok(Json(json!({
        "business": b.name, "action": action, "dry_run": false,
        "touched": done.touched, "cursor": done.cursor, "done": done.cursor.is_none(),
    })))
}
