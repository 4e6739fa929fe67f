//! `/metrics`, `/readyz` (and `/healthz`, a constant): what probes and
//! Prometheus read.

use std::sync::Arc;
use std::time::Duration;

use super::HttpState;
use crate::store::{Counts, FORECAST_WINDOWS};
use crate::telemetry::{Health, METRICS};

/// Ready when both servers are reached and no business's publishing is
/// paused; the reasons name only the businesses the caller may see (a
/// business with a token of its own needs that token or a global one).
pub(super) async fn ready(
    axum::extract::State(state): axum::extract::State<Arc<HttpState>>,
    headers: axum::http::HeaderMap,
) -> (axum::http::StatusCode, String) {
    let redis = state.redis.is_up();
    let amqp = state.amqp.is_up();
    let paused = crate::telemetry::paused();
    let seen = state.seen_by(&super::auth::caller(&state, &headers), true);
    let code = if redis && amqp && paused.is_empty() {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = format!(
        "redis: {}\namqp: {}\n",
        up_word(&state.redis),
        up_word(&state.amqp)
    );
    let mut unseen = 0;
    for (business, reason) in paused {
        if !seen.iter().any(|b| b.name == business) {
            unseen += 1;
            continue;
        }
        body.push_str(&format!(
            "business {business}: publishing paused, members stay pending ({reason})\n"
        ));
    }
    if unseen > 0 {
        body.push_str(&format!(
            "{unseen} business(es) this request may not read: publishing paused (send a token that reads them to see which)\n"
        ));
    }
    (code, body)
}

/// "up", or "down: " and the latest reason, so a probe's output says why.
pub(super) fn up_word(health: &Health) -> String {
    if health.is_up() {
        "up".into()
    } else {
        format!("down: {}", health.reason())
    }
}

/// Gauges are read from Redis at scrape time, so an idle delayd that nobody
/// scrapes sends Redis nothing for them. A scrape shows only the
/// businesses its caller may see: one without a token sees those without
/// a token of their own.
pub(super) async fn metrics(
    axum::extract::State(state): axum::extract::State<Arc<HttpState>>,
    headers: axum::http::HeaderMap,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let seen: Vec<String> = state
        .seen_by(&super::auth::caller(&state, &headers), true)
        .iter()
        .map(|b| b.name.clone())
        .collect();
    {
        let _guard = state.scrape.lock().await;
        let mut totals: std::collections::BTreeMap<&str, (Counts, f64)> = Default::default();
        let mut held: std::collections::BTreeMap<&str, bool> = Default::default();
        // Every key at once, each bounded: with Redis away a scrape answers
        // within the bound, not the bound times the number of keys.
        let stores = state.stores();
        let all = futures::future::join_all(stores.iter().map(|(business, store)| async move {
            let stats = tokio::time::timeout(Duration::from_secs(2), store.stats()).await;
            (business, stats)
        }))
        .await;
        for (business, stats) in all {
            if let Ok(Ok(s)) = stats {
                let t = totals.entry(business.as_str()).or_default();
                t.0 += s.counts;
                if let Some(oldest) = s.oldest_due_ms {
                    t.1 = t.1.max((s.now_ms as f64 - oldest) / 1000.0);
                }
                *held.entry(business.as_str()).or_default() |= s.paused.is_some();
            }
        }
        for (business, (c, o)) in totals {
            METRICS
                .pending
                .with_label_values(&[business])
                .set(c.pending as i64);
            METRICS
                .inflight
                .with_label_values(&[business])
                .set(c.in_flight as i64);
            METRICS
                .dead
                .with_label_values(&[business])
                .set(c.dead as i64);
            METRICS.oldest_overdue.with_label_values(&[business]).set(o);
            for ((window, _), n) in FORECAST_WINDOWS.iter().zip(c.due_within) {
                METRICS
                    .pending_due_within
                    .with_label_values(&[business, window])
                    .set(n as i64);
            }
        }
        for (business, paused) in held {
            METRICS
                .operator_paused
                .with_label_values(&[business])
                .set(paused as i64);
        }
        tenant_gauges(&state).await;
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        METRICS.render_where(|b| seen.iter().any(|s| s == b)),
    )
}

/// The per-tenant gauges of every business with tenants, each read bounded
/// like the others (one listing of its first tenants per key).
async fn tenant_gauges(state: &HttpState) {
    let lists =
        futures::future::join_all(state.businesses.iter().filter(|b| b.tenants.is_some()).map(
            |b| async move {
                let stores: Vec<crate::store::Store> = state
                    .stores()
                    .iter()
                    .filter(|(name, _)| *name == b.name)
                    .map(|(_, s)| s.clone())
                    .collect();
                let list =
                    crate::tasks::tenants::list(b, &stores, 0, crate::tasks::tenants::MOST_LISTED);
                (b, tokio::time::timeout(Duration::from_secs(2), list).await)
            },
        ))
        .await;
    METRICS.tenants.reset();
    for (b, list) in lists {
        if let Ok(Ok(list)) = list {
            METRICS.tenants.set(&b.name, &list);
        }
    }
}
