//! `GET /audit`: the newest writes first, a page at a time.

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::json;

use super::{bounded, ApiError, Reply, Shared};
use crate::http::auth::{require_read, Role};
use crate::tasks::audit;

/// Query of `GET /audit`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Entries per page (1 to 1000; 50 unless set).
    limit: Option<usize>,
    /// The previous page's `cursor`: entries older than it.
    cursor: Option<String>,
}

/// The newest entries of the audit log, with a cursor to older ones.
pub async fn list(
    state: Shared,
    headers: HeaderMap,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Reply {
    let Query(q) = q?;
    let role = require_read(&state, &headers, None)?;
    let limit = match q.limit.unwrap_or(50) {
        n @ 1..=1000 => n,
        n => {
            return Err(ApiError::bad(format!(
                "\"limit\" must be between 1 and 1000 (got {n})"
            )))
        }
    };
    if let Some(c) = q.cursor.as_deref().filter(|c| !audit::valid_id(c)) {
        return Err(ApiError::bad(format!(
            "\"cursor\" \"{c}\" is not a cursor this API returned"
        )));
    }
    let mut conn = state.conn("audit")?;
    let entries = bounded(
        "audit",
        audit::recent(&mut conn, limit, q.cursor.as_deref()),
    )
    .await?;
    let cursor = (entries.len() == limit)
        .then(|| entries.last().map(|e| e.id.clone()))
        .flatten();
    let mut entries = entries;
    if !matches!(role, Role::Admin | Role::Reader) {
        // A business's token sees its own business's writes only, no token
        // those of businesses without a token of their own; the cursor
        // still walks the whole log, so a page may hold fewer.
        let seen = state.seen_by(&role, state.read_token.is_none());
        entries.retain(|e| seen.iter().any(|b| b.name == e.business));
    }
    Ok(Json(
        json!({ "entries": entries, "cursor": cursor, "kept": audit::KEEP }),
    ))
}
