//! `POST /businesses/{business}/pause` and `/resume`: stop and restart
//! claims of a business on every instance; pending work stays.

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::json;

use super::{bounded, Reply, Shared};
use crate::http::auth::require_admin;
use crate::tasks::audit::Write;
use crate::tasks::pause;

/// Pauses the business: no instance claims from it until it is resumed.
pub async fn pause(state: Shared, headers: HeaderMap, Path(name): Path<String>) -> Reply {
    set(state, headers, name, true).await
}

/// Lets a paused business's claims run again.
pub async fn resume(state: Shared, headers: HeaderMap, Path(name): Path<String>) -> Reply {
    set(state, headers, name, false).await
}

async fn set(state: Shared, headers: HeaderMap, name: String, on: bool) -> Reply {
    let role = require_admin(&state, &headers, &name)?;
    let b = state.business(&name)?;
    let stores = state.stores_of(&b.name)?;
    let changed = if on {
        bounded(&b.name, pause::pause(&stores, role.name())).await?
    } else {
        bounded(&b.name, pause::resume(&stores)).await?
    };
    state
        .audit(Write {
            by: role.name(),
            business: &b.name,
            action: if on { "pause" } else { "resume" },
            what: "every key",
            count: changed as u64,
        })
        .await;
    let now = bounded(&b.name, pause::state(&stores)).await?;
    // The page shows the new state at once, not a second later.
    state.overview.forget("overview");
    let result = match (on, changed > 0) {
        (true, true) => "paused",
        (true, false) => "paused_already",
        (false, true) => "resumed",
        (false, false) => "not_paused",
    };
    Ok(Json(
        json!({ "business": b.name, "result": result, "pause": now }),
    ))
}
