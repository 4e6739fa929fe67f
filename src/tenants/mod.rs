//! Fair release among the tenants of a business (docs/tenants.md): each
//! claim moves due members out of the tenants' own sorted sets in weighted
//! fair shares, so one tenant's burst never makes another tenant's members
//! wait behind it. The choice is [`share::shares`], a pure function; the
//! Redis side is one script (`claim_tenants.lua`), which also keeps each
//! tenant's virtual time in Redis so several instances share one fairness.

pub mod share;

use std::sync::Mutex;
use std::time::Duration;

use crate::config::Tenants;
use crate::store::{Claim, Store, StoreError, TenantBudget, TenantDue, TenantTake};

/// Most tenants with due work one claim reports for the next choice: the
/// ones whose earliest member is oldest. Beyond it, a tenant waits until
/// older ones drain; fairness is exact while fewer tenants have due work.
pub const REPORTED: usize = 1000;

/// One key's fair release: the weights, and what the last claim saw.
#[derive(Debug, Default)]
pub struct Fair {
    settings: Tenants,
    /// The release budgets of the tenants with a `max_rate`, on this key.
    budgets: Vec<TenantBudget>,
    /// Tenants with due work at the last claim; the next choice uses them.
    seen: Mutex<Vec<TenantDue>>,
}

impl Fair {
    /// Fair release with `settings`' weights and rates, on one of `shards`
    /// keys: each key's budget holds a tenant to its `max_rate / shards`,
    /// so that the keys together hold it to its `max_rate` while its
    /// members are spread evenly over them.
    pub fn new(settings: Tenants, shards: usize) -> Self {
        let budgets = settings
            .max_rates
            .iter()
            .map(|(t, rate)| TenantBudget::new(t, *rate, shards))
            .collect();
        Self {
            settings,
            budgets,
            seen: Mutex::default(),
        }
    }

    /// Claims up to `limit` members, the tenants' due members shared by
    /// weight. A claim that found tenants with due work but had none to
    /// share (the first after an idle spell) shares them at once.
    pub async fn claim(
        &self,
        store: &Store,
        limit: usize,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let mut claim = self.claim_once(store, limit, lease).await?;
        if claim.members.is_empty() && !claim.paused && self.has_due() {
            claim = self.claim_once(store, limit, lease).await?;
        }
        Ok(claim)
    }

    async fn claim_once(
        &self,
        store: &Store,
        limit: usize,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let (takes, floor) = self.plan(limit);
        let (claim, seen) = store
            .claim_tenants(limit, lease, &takes, (floor, REPORTED), &self.budgets)
            .await?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        Ok(claim)
    }

    fn has_due(&self) -> bool {
        !self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The most a tenant with a `max_rate` can be released in one claim:
    /// its budget when full. Its share is planned at no more, so the rest
    /// of the batch goes to the others.
    fn most_now(&self, tenant: &[u8]) -> Option<u64> {
        let b = self
            .budgets
            .iter()
            .find(|b| b.tenant.as_bytes() == tenant)?;
        Some(b.burst)
    }

    /// The next batch's takes from what the last claim saw.
    fn plan(&self, limit: usize) -> (Vec<TenantTake>, f64) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let backlogs: Vec<share::Backlog> = seen
            .iter()
            .map(|t| share::Backlog {
                tenant: &t.tenant,
                due: self
                    .most_now(&t.tenant)
                    .map_or(t.due, |most| t.due.min(most)),
                vtime: t.vtime,
                weight: t.weight.unwrap_or_else(|| self.settings.weight(&t.tenant)),
            })
            .collect();
        let s = share::shares(&backlogs, limit as u64);
        let takes = s
            .counts
            .into_iter()
            .map(|(tenant, count)| TenantTake {
                tenant: tenant.to_vec(),
                count,
                // The script charges a weight set at run time in its place.
                weight: self.settings.weight(tenant),
            })
            .collect();
        (takes, s.floor)
    }
}
