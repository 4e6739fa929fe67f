//! `GET /businesses/{business}/tenants` (each tenant with pending, due now,
//! oldest overdue, weight, `max_rate` and pause) and
//! `POST …/tenants/{tenant}/pause`, `/resume`, `/weight` and `/max_rate`
//! (admin token), on a business with tenants.

use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::json;

use super::{bounded, count_within, ApiError, Asked, Reply, Shared};
use crate::config::{Business, TenantSetting};
use crate::http::auth::require_admin;
use crate::tasks::audit::Write;
use crate::tasks::tenants::{self, MOST_LISTED};

/// Query of `GET …/tenants`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsQuery {
    /// Tenants per page (1 to 1000; 100 unless set).
    limit: Option<u64>,
    /// Rank in the index of the page's first tenant (0 unless set).
    offset: Option<u64>,
}

/// The business's tenants, the earliest head first.
pub async fn list(state: Shared, Asked(name, q): Asked<TenantsQuery>) -> Reply {
    let limit = count_within("limit", q.limit, 100, MOST_LISTED)?;
    let b = state.business(&name)?;
    with_tenants(b)?;
    let stores = state.stores_of(&b.name)?;
    let offset = q.offset.unwrap_or(0);
    let l = bounded(&b.name, tenants::list(b, &stores, offset, limit)).await?;
    Ok(Json(json!({
        "business": b.name,
        "now_ms": l.now_ms,
        "tenants": l.tenants,
        "paused": l.paused,
        "offset": offset,
        "rows": l.rows,
    })))
}

/// Pauses one tenant on every instance: none of its members is claimed
/// until it resumes; its members stay and producers go on writing.
pub async fn pause(state: Shared, headers: HeaderMap, Path(p): Path<(String, String)>) -> Reply {
    let (role, b, tenant) = target(&state, &headers, &p)?;
    let stores = state.stores_of(&b.name)?;
    let n = bounded(
        &b.name,
        tenants::pause(&stores, tenant.as_bytes(), role.name()),
    )
    .await?;
    audit(&state, role.name(), b, "tenant_pause", &tenant, n).await;
    let result = if n > 0 { "paused" } else { "paused_already" };
    Ok(Json(
        json!({ "business": b.name, "tenant": tenant, "result": result }),
    ))
}

/// Lets a paused tenant's members be claimed again.
pub async fn resume(state: Shared, headers: HeaderMap, Path(p): Path<(String, String)>) -> Reply {
    let (role, b, tenant) = target(&state, &headers, &p)?;
    let stores = state.stores_of(&b.name)?;
    let n = bounded(&b.name, tenants::resume(&stores, tenant.as_bytes())).await?;
    audit(&state, role.name(), b, "tenant_resume", &tenant, n).await;
    let result = if n > 0 { "resumed" } else { "not_paused" };
    Ok(Json(
        json!({ "business": b.name, "tenant": tenant, "result": result }),
    ))
}

/// Body of `POST …/tenants/{tenant}/weight`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightBody {
    /// 1 to 1000, or `null` for the config's weight again.
    weight: Option<u32>,
}

/// Sets one tenant's weight on every instance from the next claim on, or
/// with `null` returns it to the config's.
pub async fn weight(
    state: Shared,
    headers: HeaderMap,
    Path(p): Path<(String, String)>,
    body: Result<Json<WeightBody>, JsonRejection>,
) -> Reply {
    let Json(body) = body?;
    set(&state, &headers, &p, TenantSetting::Weight, body.weight).await
}

/// Body of `POST …/tenants/{tenant}/max_rate`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxRateBody {
    /// 1 to 10,000,000 members a second, or `null` for the config's again.
    max_rate: Option<u32>,
}

/// Sets one tenant's `max_rate` on every instance, or with `null` returns
/// it to the config's: claims hold it from the first claim that sees the
/// tenant with due work.
pub async fn max_rate(
    state: Shared,
    headers: HeaderMap,
    Path(p): Path<(String, String)>,
    body: Result<Json<MaxRateBody>, JsonRejection>,
) -> Reply {
    let Json(body) = body?;
    set(&state, &headers, &p, TenantSetting::MaxRate, body.max_rate).await
}

/// Sets `setting` of the tenant in the path to `value` (`None`: the
/// config's again); answers with the value in force and the one before.
async fn set(
    state: &Shared,
    headers: &HeaderMap,
    p: &(String, String),
    setting: TenantSetting,
    value: Option<u32>,
) -> Reply {
    let (role, b, tenant) = target(state, headers, p)?;
    let (field, most) = (setting.field(), setting.most());
    if let Some(v) = value.filter(|v| !(1..=most).contains(v)) {
        return Err(ApiError::bad(format!(
            "\"{field}\" must be from 1 to {most}, or null for the config's (got {v})"
        )));
    }
    let stores = state.stores_of(&b.name)?;
    let before = bounded(
        &b.name,
        tenants::set(&stores, setting, tenant.as_bytes(), value),
    )
    .await?;
    let config = b
        .tenants
        .as_ref()
        .and_then(|t| t.configured(setting, tenant.as_bytes()));
    audit(state, role.name(), b, setting.audit_action(), &tenant, 1).await;
    Ok(Json(json!({
        "business": b.name,
        "tenant": tenant,
        field: value.or(config),
        "set_at_run_time": value.is_some(),
        "before": before.or(config),
    })))
}

/// The caller (admin of the business), the business, and the tenant named
/// in the path, or why not.
fn target<'a>(
    state: &'a Shared,
    headers: &HeaderMap,
    (name, tenant): &(String, String),
) -> Result<(crate::http::auth::Role, &'a Business, String), ApiError> {
    let role = require_admin(state, headers, name)?;
    let b = state.business(name)?;
    with_tenants(b)?;
    if let Some(why) = crate::tasks::tenant_refused(b, tenant.as_bytes()) {
        return Err(ApiError::bad(format!("tenant \"{tenant}\": {why}")));
    }
    Ok((role, b, tenant.clone()))
}

/// A 400 for a business without tenants.
fn with_tenants(b: &Business) -> Result<(), ApiError> {
    tenants::none_in(b).map_or(Ok(()), |why| Err(ApiError::bad(why)))
}

async fn audit(state: &Shared, by: &str, b: &Business, action: &str, tenant: &str, n: usize) {
    state
        .audit(Write {
            by,
            business: &b.name,
            action,
            what: tenant,
            count: n as u64,
        })
        .await;
}
