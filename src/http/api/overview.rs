//! `GET /businesses` (every business at a glance) and
//! `GET /businesses/{business}/histogram` (what comes due when).

use std::time::Duration;

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::{bounded, member_kind, ApiError, Reply, Shared};
use crate::http::auth::{require_read, Role};
use crate::store::{Totals, FORECAST_WINDOWS};

/// How long an overview or histogram is reused.
const REUSE: Duration = Duration::from_secs(1);

/// Every business: counts from one stats script call per key, rates and
/// lateness from this process's counters, paused and why.
pub async fn businesses(state: Shared, headers: HeaderMap) -> Reply {
    let role = require_read(&state, &headers, None)?;
    let s = state.0.clone();
    let mut v = state
        .overview
        .get_or("overview", REUSE, async move {
            let paused = crate::telemetry::paused();
            let mut rows = Vec::new();
            let all = futures::future::join_all(s.businesses.iter().map(|b| {
                let s = s.clone();
                async move {
                    let stores = s.stores_of(&b.name)?;
                    let stats = futures::future::try_join_all(
                        stores.iter().map(|st| bounded(&b.name, st.stats())),
                    )
                    .await?;
                    Ok::<_, ApiError>(stats)
                }
            }))
            .await;
            let mut now_ms = None;
            for (b, stats) in s.businesses.iter().zip(all) {
                let rates = s.rates.rates(&b.name);
                let mut row = json!({
                    "name": b.name,
                    "member": member_kind(b),
                    "shards": b.shards,
                    "rates": rates,
                    "paused": paused.get(&b.name),
                    "intake": super::intake::state(b, &rates),
                    "schedules": b.recurring.len(),
                    "tenants": b.tenants.is_some(),
                });
                match stats {
                    Ok(stats) => {
                        now_ms = now_ms.max(stats.iter().map(|x| x.now_ms).max());
                        let t = Totals::of(&b.name, &stats);
                        let within: serde_json::Map<String, Value> = FORECAST_WINDOWS
                            .iter()
                            .zip(t.due_within)
                            .map(|((w, _), n)| (w.to_string(), n.into()))
                            .collect();
                        let o = row.as_object_mut().expect("an object");
                        o.insert("pending".into(), t.pending.into());
                        o.insert("due_now".into(), t.due_now.into());
                        o.insert("oldest_overdue_ms".into(), t.oldest_overdue_ms.into());
                        o.insert("next_due_in_ms".into(), t.next_due_in_ms.into());
                        o.insert("in_flight".into(), t.in_flight.into());
                        o.insert("dead".into(), t.dead.into());
                        o.insert("due_within".into(), within.into());
                        o.insert("pause".into(), json!(t.paused));
                        if b.tenants.is_some() {
                            o.insert("tenants_uncounted".into(), t.tenants_uncounted.into());
                        }
                    }
                    Err(e) => row["error"] = e.message().into(),
                }
                rows.push(row);
            }
            Ok(json!({
                "now_ms": now_ms,
                "read_only": s.admin_token.is_none()
                    && s.businesses.iter().all(|b| b.tokens.admin.is_none()),
                "redis": super::super::probes::up_word(&s.redis),
                "amqp": super::super::probes::up_word(&s.amqp),
                "businesses": rows,
            }))
        })
        .await?;
    // Shared by every caller; what this caller may do is its own.
    v["can_write"] = match role.only() {
        Some(own) => role.writes(own),
        None => role == Role::Admin,
    }
    .into();
    // Each caller sees only the businesses it may read: a business's token
    // its own, no token those without a token of their own.
    let seen = state.seen_by(&role, state.read_token.is_none());
    if let Some(rows) = v["businesses"].as_array_mut() {
        rows.retain(|r| seen.iter().any(|b| r["name"] == b.name.as_str()));
    }
    v["reads_need_token"] = state.read_token.is_some().into();
    Ok(Json(v))
}

/// The windows' ends, ms from now: overdue, then each minute of the next
/// hour, each hour of the next day, each day of the next week (and one
/// count beyond): 91 `ZCOUNT`s per key, whatever the number pending.
fn window_ends() -> Vec<u64> {
    const MIN: u64 = 60_000;
    const HOUR: u64 = 60 * MIN;
    const DAY: u64 = 24 * HOUR;
    let mut ends = vec![0];
    ends.extend((1..=60).map(|m| m * MIN));
    ends.extend((2..=24).map(|h| h * HOUR));
    ends.extend((2..=7).map(|d| d * DAY));
    ends
}

/// A window's name: `overdue`, `+5m`, `+3h`, `+2d` (the end of the
/// window), `later`.
fn label(i: usize, ends: &[u64]) -> String {
    if i == 0 {
        return "overdue".into();
    }
    let Some(end) = ends.get(i) else {
        return "later".into();
    };
    match end {
        e if e % 86_400_000 == 0 && *e > 3_600_000 * 24 => format!("+{}d", e / 86_400_000),
        e if e % 3_600_000 == 0 && *e > 3_600_000 => format!("+{}h", e / 3_600_000),
        e => format!("+{}m", e / 60_000),
    }
}

/// The due-time histogram of one business, its shards summed.
pub async fn histogram(state: Shared, Path(name): Path<String>) -> Reply {
    let b = state.business(&name)?.clone();
    let stores = state.stores_of(&b.name)?;
    let key = format!("histogram:{}", b.name);
    let v = state
        .overview
        .get_or(&key, REUSE, async move {
            let ends = window_ends();
            let per_key = futures::future::try_join_all(
                stores.iter().map(|s| bounded(&b.name, s.due_counts(&ends))),
            )
            .await?;
            let now_ms = per_key.iter().map(|c| c.now_ms).max().unwrap_or(0);
            let mut counts = vec![0u64; ends.len() + 1];
            for c in &per_key {
                for (sum, n) in counts.iter_mut().zip(&c.counts) {
                    *sum += n;
                }
            }
            let buckets: Vec<Value> = counts
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let from = (i > 0).then(|| now_ms + ends[i - 1] as i64);
                    let to = ends.get(i).map(|e| now_ms + *e as i64);
                    json!({ "label": label(i, &ends), "from_ms": from, "to_ms": to, "count": n })
                })
                .collect();
            Ok(json!({ "business": b.name, "now_ms": now_ms, "buckets": buckets }))
        })
        .await?;
    Ok(Json(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_an_hour_by_minute_a_day_by_hour_a_week_by_day() {
        let ends = window_ends();
        assert_eq!(ends.len(), 90);
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(label(0, &ends), "overdue");
        assert_eq!(label(1, &ends), "+1m");
        assert_eq!(label(60, &ends), "+60m");
        assert_eq!(label(61, &ends), "+2h");
        assert_eq!(label(83, &ends), "+24h");
        assert_eq!(label(84, &ends), "+2d");
        assert_eq!(label(89, &ends), "+7d");
        assert_eq!(label(90, &ends), "later");
    }
}
