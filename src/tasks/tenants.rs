//! One tenant of a business with tenants, steered over all the business's
//! keys for the CLI and the API: pause and resume it, set its weight or
//! `max_rate` at run time, and list tenants with their counts. A business with shards
//! has tenants on each key; each action applies to every key, and a
//! listing adds each tenant's counts up over the keys.

use std::collections::BTreeMap;

use crate::config::{Business, TenantSetting};
use crate::store::{Paused, Store, StoreError, TenantRow};

/// Most tenants one listing shows per key.
pub const MOST_LISTED: u64 = 1000;

/// The one-line refusal for a business without tenants; `None` when `b`
/// has them.
pub fn none_in(b: &Business) -> Option<String> {
    b.tenants.is_none().then(|| {
        format!(
            "business \"{}\" has no tenants (tenants = true in its config)",
            b.name
        )
    })
}

/// Pauses `tenant` on every key, recording `by`; returns how many keys
/// this call paused it on (0: it was paused already).
pub async fn pause(stores: &[Store], tenant: &[u8], by: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for s in stores {
        n += s.pause_tenant(tenant, by).await? as usize;
    }
    Ok(n)
}

/// Resumes `tenant` on every key; returns how many keys it was paused on.
pub async fn resume(stores: &[Store], tenant: &[u8]) -> Result<usize, StoreError> {
    let mut n = 0;
    for s in stores {
        n += s.resume_tenant(tenant).await? as usize;
    }
    Ok(n)
}

/// Sets `tenant`'s `setting` on every key (`None`: back to the config's);
/// returns the value set at run time before, if any key had one. A
/// `max_rate` is the business's: each key's budget takes its share.
pub async fn set(
    stores: &[Store],
    setting: TenantSetting,
    tenant: &[u8],
    value: Option<u32>,
) -> Result<Option<u32>, StoreError> {
    let mut before = None;
    for s in stores {
        before = s.set_tenant(setting, tenant, value).await?.or(before);
    }
    Ok(before)
}

/// One tenant as a listing shows it, over every key of its business.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TenantView {
    /// The tenant's name (lossy UTF-8: producers write bytes).
    pub tenant: String,
    /// Its members waiting in its sets.
    pub pending: u64,
    /// How many of them are due now.
    pub due: u64,
    /// Due time of its earliest member, epoch ms.
    pub next_due_ms: Option<i64>,
    /// How long its earliest member is overdue, ms (0 when not due).
    pub oldest_overdue_ms: u64,
    /// The weight its shares follow: set at run time, else the config's.
    pub weight: u32,
    /// Whether that weight was set at run time.
    pub weight_set_at_run_time: bool,
    /// The operator's pause, if paused.
    pub paused: Option<Paused>,
    /// Members claims released from its sets in the last whole second.
    pub released_per_s: u64,
    /// The most members a second it is released at: set at run time, else
    /// the config's; `None` when neither caps it.
    pub max_rate: Option<u32>,
    /// Whether that `max_rate` was set at run time.
    pub max_rate_set_at_run_time: bool,
}

/// A listing: the tenants, the earliest head first, and the totals.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TenantList {
    /// Redis's clock when it was read, epoch ms.
    pub now_ms: i64,
    /// Tenants with pending members (per key; a tenant on several keys
    /// counts on each).
    pub tenants: u64,
    /// Paused tenants (per key, likewise).
    pub paused: u64,
    /// The page.
    pub rows: Vec<TenantView>,
}

/// Up to `limit` tenants (at most [`MOST_LISTED`]) from rank `offset` of
/// each key's index, merged by name, the earliest head first.
pub async fn list(
    b: &Business,
    stores: &[Store],
    offset: u64,
    limit: u64,
) -> Result<TenantList, StoreError> {
    let limit = limit.clamp(1, MOST_LISTED);
    let mut out = TenantList {
        now_ms: 0,
        tenants: 0,
        paused: 0,
        rows: Vec::new(),
    };
    let mut by_name: BTreeMap<Vec<u8>, TenantRow> = BTreeMap::new();
    for s in stores {
        let page = s.tenants_page(offset, limit).await?;
        out.now_ms = out.now_ms.max(page.now_ms);
        out.tenants += page.tenants;
        out.paused += page.paused;
        for r in page.rows {
            match by_name.get_mut(&r.tenant) {
                Some(m) => add_up(m, r),
                None => {
                    by_name.insert(r.tenant.clone(), r);
                }
            }
        }
    }
    let mut rows: Vec<TenantView> = by_name
        .into_values()
        .map(|r| TenantView {
            tenant: String::from_utf8_lossy(&r.tenant).into_owned(),
            pending: r.pending,
            due: r.due,
            next_due_ms: r.head_ms,
            oldest_overdue_ms: r.head_ms.map_or(0, |h| (out.now_ms - h).max(0) as u64),
            weight: r
                .weight
                .unwrap_or_else(|| b.tenants.as_ref().map_or(1, |t| t.weight(&r.tenant))),
            weight_set_at_run_time: r.weight.is_some(),
            paused: r.paused,
            released_per_s: r.released_per_s,
            max_rate: r
                .max_rate
                .or_else(|| b.tenants.as_ref().and_then(|t| t.max_rate(&r.tenant))),
            max_rate_set_at_run_time: r.max_rate.is_some(),
        })
        .collect();
    rows.sort_by_key(|r| (r.next_due_ms.unwrap_or(i64::MAX), r.tenant.clone()));
    rows.truncate(limit as usize);
    out.rows = rows;
    Ok(out)
}

/// One tenant's row on another key, added to its row so far.
fn add_up(m: &mut TenantRow, r: TenantRow) {
    m.pending += r.pending;
    m.due += r.due;
    m.released_per_s += r.released_per_s;
    m.head_ms = match (m.head_ms, r.head_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    m.paused = m.paused.take().or(r.paused);
    m.weight = m.weight.or(r.weight);
    m.max_rate = m.max_rate.or(r.max_rate);
}
