//! The dead set: list with reasons; requeue or purge one member, those
//! whose reason matches, or all, always able to count first (`dry_run`).

use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::{
    bounded, bounded_by, dead_filter_of, handle, member_kind, page_limit, ApiError, Asked, Reply,
    Shared, Shown,
};
use crate::http::auth::{require_admin, require_read};
use crate::tasks::audit::Write;
use crate::tasks::dead::{self, Action, Filter};

/// Query of `GET /dead`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadQuery {
    /// Members to list, oldest first (1 to 1000; 100 unless set).
    limit: Option<usize>,
}

/// The oldest dead members with when and why they died.
pub async fn list(state: Shared, Asked(name, q): Asked<DeadQuery>) -> Reply {
    let b = state.business(&name)?;
    let limit = page_limit(q.limit, 100)?;
    let stores = state.stores_of(&b.name)?;
    let (now_ms, members) = bounded(&b.name, dead::list(&stores, limit)).await?;
    let total = bounded(&b.name, dead::count(&stores, &Filter::All)).await?;
    let rows: Vec<Value> = members
        .iter()
        .map(|m| {
            json!({
                "member": Shown::of_start(&m.member.head, m.member.size),
                "handle": handle(&m.member, m.died_ms),
                "died_ms": m.died_ms as i64, "reason": m.reason,
            })
        })
        .collect();
    Ok(Json(json!({
        "business": b.name, "member": member_kind(b), "now_ms": now_ms,
        "total": total.count, "members": rows,
    })))
}

/// Body of `POST /dead/requeue` and `/dead/purge`: exactly one of
/// `handle`, `member`, `reason` or `all: true`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadBody {
    /// This one member, by the handle a listing gave: its exact bytes, or
    /// its SHA-1 and when it died.
    handle: Option<String>,
    /// This one member, as UTF-8 text (the id, or the body in body mode).
    member: Option<String>,
    /// Members whose reason contains this text.
    reason: Option<String>,
    /// Every dead member.
    #[serde(default)]
    all: bool,
    /// Count, do not act.
    #[serde(default)]
    dry_run: bool,
    /// Act on at most this many.
    limit: Option<usize>,
}

impl DeadBody {
    /// The filter as the audit log names it.
    fn described(&self) -> String {
        match (&self.handle, &self.member, &self.reason) {
            (Some(h), _, _) => format!("handle {h}"),
            (_, Some(m), _) => format!("member \"{m}\""),
            (_, _, Some(r)) => format!("reason containing \"{r}\""),
            _ => "all".into(),
        }
    }

    fn filter(&self) -> Result<Filter, ApiError> {
        if let Some(h) = &self.handle {
            if self.member.is_some() || self.reason.is_some() || self.all {
                return Err(ApiError::bad(
                    "give exactly one of \"handle\", \"member\", \"reason\" or \"all\": true",
                ));
            }
            return dead_filter_of(h);
        }
        match (&self.member, &self.reason, self.all) {
            (Some(m), None, false) => Ok(Filter::Member(m.clone().into_bytes())),
            (None, Some(r), false) if r.is_empty() => Err(ApiError::bad(
                "\"reason\" is empty; give text the reasons contain, or \"all\": true",
            )),
            (None, Some(r), false) => Ok(Filter::Reason(r.clone())),
            (None, None, true) => Ok(Filter::All),
            _ => Err(ApiError::bad(
                "give exactly one of \"handle\", \"member\", \"reason\" or \"all\": true",
            )),
        }
    }
}

/// A requeue's or purge's body, or why it was refused.
type Req = Result<Json<DeadBody>, JsonRejection>;

/// Requeues dead members: due now, attempts reset.
pub async fn requeue(state: Shared, headers: HeaderMap, path: Path<String>, req: Req) -> Reply {
    act(state, headers, path, req, Action::Requeue).await
}

/// Deletes dead members for good.
pub async fn purge(state: Shared, headers: HeaderMap, path: Path<String>, req: Req) -> Reply {
    act(state, headers, path, req, Action::Purge).await
}

/// Counting (`dry_run`) changes nothing and is a read; acting is a write.
async fn act(
    state: Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    req: Req,
    action: Action,
) -> Reply {
    let b = state.business(&name)?;
    let Json(req) = req?;
    let filter = req.filter()?;
    if req.limit == Some(0) {
        return Err(ApiError::bad("\"limit\" must be at least 1"));
    }
    let role = if req.dry_run {
        require_read(&state, &headers, Some(&b.name))?
    } else {
        require_admin(&state, &headers, &b.name)?
    };
    let stores = state.stores_of(&b.name)?;
    let done = if req.dry_run {
        bounded(&b.name, dead::count(&stores, &filter)).await?
    } else {
        bounded_by(
            std::time::Duration::from_secs(120),
            &b.name,
            dead::apply(&stores, &filter, action, req.limit.unwrap_or(usize::MAX)),
        )
        .await?
    };
    if !req.dry_run {
        state
            .audit(Write {
                by: role.name(),
                business: &b.name,
                action: action.name(),
                what: &req.described(),
                count: done.count,
            })
            .await;
    }
    Ok(Json(json!({
        "business": b.name,
        "action": action.name(),
        "dry_run": req.dry_run,
        "count": done.count,
        "partial": done.partial,
    })))
}
