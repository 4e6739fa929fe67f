//! `GET /businesses/{business}/search?body=TEXT`: in id mode, the tasks
//! whose body contains a text, a bounded page at a time (a read).

use axum::Json;
use serde_json::{json, Value};

use super::{bounded, ApiError, Reply, Shown};
use crate::config::Business;
use crate::http::HttpState;
use crate::tasks::search;

/// One page of a body search: each id with its body (cut, decoded from the
/// intake envelope where there is one) and its due time while pending.
pub async fn page(
    state: &HttpState,
    b: &Business,
    text: &str,
    limit: usize,
    cursor: Option<&str>,
) -> Reply {
    if !b.member.is_id() {
        return Err(ApiError::bad(format!(
            "business \"{}\" has member = \"body\": its members are their bodies; search them with \"prefix\"",
            b.name
        )));
    }
    if text.is_empty() || text.len() > search::MAX_TEXT {
        return Err(ApiError::bad(format!(
            "\"body\" must be 1 to {} bytes of text to find (got {})",
            search::MAX_TEXT,
            text.len()
        )));
    }
    if let Some(c) = cursor.filter(|c| !search::valid_cursor(b, c)) {
        return Err(ApiError::bad(format!(
            "\"cursor\" \"{c}\" is not a search cursor this API returned"
        )));
    }
    let mut conn = state.conn(&b.name)?;
    let page = bounded(
        &b.name,
        search::by_body(&mut conn, b, text.as_bytes(), limit, cursor),
    )
    .await?;
    let rows: Vec<Value> = page
        .found
        .iter()
        .map(|m| {
            let body = shown_body(b, &m.head, m.size);
            json!({
                "id": Shown::of(&m.id), "handle": crate::tasks::hex(&m.id),
                "body": body, "due_ms": m.due_ms,
            })
        })
        .collect();
    Ok(Json(json!({
        "business": b.name, "member": "id", "body": text, "tasks": rows,
        "cursor": page.cursor, "partial": page.cursor.is_some(),
    })))
}

/// A matching body as shown, from its start and full size: an intake
/// message's own body when the start holds its whole envelope (routing key
/// and properties), else the stored bytes.
fn shown_body(b: &Business, head: &[u8], size: usize) -> Shown {
    let envelope = b
        .intake
        .as_ref()
        .and_then(|_| crate::message::envelope::decode(head));
    match envelope {
        Some(e) => Shown::of_start(e.body, size - (head.len() - e.body.len())),
        None => Shown::of_start(head, size),
    }
}
