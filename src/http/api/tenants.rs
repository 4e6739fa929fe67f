//! `GET /businesses/{business}/tenants` (each tenant with pending, due now,
//! oldest overdue, weight, `max_rate` and pause) and
//! `POST …/tenants/{tenant}/pause`, `/resume`, `/weight` and `/max_rate`
//! (admin token), on a business with tenants.

use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use serde::de::DeserializeOwned;
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

/// Body of `POST …/tenants/{tenant}/max_rate`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxRateBody {
    /// 1 to 10,000,000 members a second, or `null` for the config's again.
    max_rate: Option<u32>,
}

/// The body of a tenant setting's `POST`: the one value it sets, under the
/// setting's own name, so that a body sent to the other setting is refused.
pub(super) trait SettingBody: DeserializeOwned + Send + 'static {
    /// The setting the body sets.
    const SETTING: TenantSetting;
    /// The value to set; `None`: the config's again.
    fn value(&self) -> Option<u32>;
}

impl SettingBody for WeightBody {
    const SETTING: TenantSetting = TenantSetting::Weight;
    fn value(&self) -> Option<u32> {
        self.weight
    }
}

impl SettingBody for MaxRateBody {
    const SETTING: TenantSetting = TenantSetting::MaxRate;
    fn value(&self) -> Option<u32> {
        self.max_rate
    }
}

/// Sets `B`'s setting of one tenant on every instance, or with `null`
/// returns it to the config's; answers with the value in force and the one
/// before. A weight holds from the next claim on; a `max_rate` from the
/// first claim that sees the tenant with due work.
pub async fn set<B: SettingBody>(
    state: Shared,
    headers: HeaderMap,
    Path(p): Path<(String, String)>,
    body: Result<Json<B>, JsonRejection>,
) -> Reply {
    let Json(body) = body?;
    let (setting, value) = (B::SETTING, body.value());
    let (role, b, tenant) = target(&state, &headers, &p)?;
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
    audit(&state, role.name(), b, setting.audit_action(), &tenant, 1).await;
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
