//! The audit log: one entry per write made through the API, `delayd dead`,
//! `pause` or `resume` (who by token name, what, how many, when), kept in one Redis
//! stream capped at about [`KEEP`] entries, so every instance writes to
//! and shows the same log and it never grows without bound.

use redis::aio::ConnectionLike;

use crate::store::StoreError;

/// The stream's key.
pub const KEY: &str = "delayd:audit";
/// Entries kept, about (`MAXLEN ~`: Redis trims whole nodes, cheaply).
pub const KEEP: usize = 10_000;
/// Longest `what` kept: a filter or an id, never a whole body.
const MAX_WHAT: usize = 200;

/// One write, as recorded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// The stream id: when (epoch ms) and a sequence number.
    pub id: String,
    /// When, epoch ms on Redis's clock.
    pub at_ms: i64,
    /// Who: the token's name (`admin_token`) or `cli`; never a token.
    pub by: String,
    /// The business written to.
    pub business: String,
    /// The action: `schedule`, `cancel`, `requeue`, `purge`, `pause`, ...
    pub action: String,
    /// What it named: an id, a filter.
    pub what: String,
    /// How many tasks it changed.
    pub count: u64,
}

/// A write to record.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    /// Who: a token's name or `cli`.
    pub by: &'a str,
    /// The business.
    pub business: &'a str,
    /// The action.
    pub action: &'a str,
    /// What it named.
    pub what: &'a str,
    /// How many tasks it changed.
    pub count: u64,
}

/// Appends `w` to the log.
pub async fn record<C: ConnectionLike>(conn: &mut C, w: &Write<'_>) -> Result<(), StoreError> {
    let mut what = w.what.to_string();
    if what.len() > MAX_WHAT {
        let mut end = MAX_WHAT;
        while !what.is_char_boundary(end) {
            end -= 1;
        }
        what.truncate(end);
        what.push('…');
    }
    redis::cmd("XADD")
        .arg(KEY)
        .arg("MAXLEN")
        .arg("~")
        .arg(KEEP)
        .arg("*")
        .arg("by")
        .arg(w.by)
        .arg("business")
        .arg(w.business)
        .arg("action")
        .arg(w.action)
        .arg("what")
        .arg(what)
        .arg("count")
        .arg(w.count)
        .query_async::<String>(conn)
        .await?;
    Ok(())
}

/// The newest `limit` entries, newest first, older than the entry `before`
/// when given (the previous page's last id).
pub async fn recent<C: ConnectionLike>(
    conn: &mut C,
    limit: usize,
    before: Option<&str>,
) -> Result<Vec<Entry>, StoreError> {
    let end = before.map_or("+".to_string(), |id| format!("({id}"));
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg(KEY)
        .arg(end)
        .arg("-")
        .arg("COUNT")
        .arg(limit)
        .query_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, fields)| entry(id, fields))
        .collect())
}

fn entry(id: String, fields: Vec<(String, String)>) -> Entry {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    Entry {
        at_ms: id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0),
        by: get("by"),
        business: get("business"),
        action: get("action"),
        what: get("what"),
        count: get("count").parse().unwrap_or(0),
        id,
    }
}

/// Whether `id` is a stream id a page of the log could have returned.
pub fn valid_id(id: &str) -> bool {
    match id.split_once('-') {
        Some((ms, seq)) => ms.parse::<u64>().is_ok() && seq.parse::<u64>().is_ok(),
        None => false,
    }
}
