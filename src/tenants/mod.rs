//! Fair release among the tenants of a business (docs/tenants.md): each
//! claim moves due members out of the tenants' own sorted sets in weighted
//! fair shares, so one tenant's burst never makes another tenant's members
//! wait behind it. The choice is [`share::shares`], a pure function; the
//! Redis side is one script (`claim_tenants.lua`), which also keeps each
//! tenant's virtual time in Redis so several instances share one fairness.

pub mod share;

use std::borrow::Cow;
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
    /// How many keys the business's members are spread over.
    shards: usize,
    /// The release budgets of the config's `max_rate`s, on this key.
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
            shards,
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
        let (takes, floor, budgets) = self.plan(limit);
        let (claim, seen) = store
            .claim_tenants(limit, lease, &takes, (floor, REPORTED), &budgets)
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

    /// The release budgets on this key: the config's, each replaced by a
    /// `max_rate` set at run time that the last claim reported (a tenant is
    /// reported while it has due work, which is when its budget matters).
    /// The config's alone, unless some tenant has one set at run time.
    fn budgets(&self, seen: &[TenantDue]) -> Cow<'_, [TenantBudget]> {
        let set: Vec<(&str, u32)> = seen
            .iter()
            .filter_map(|t| Some((std::str::from_utf8(&t.tenant).ok()?, t.max_rate?)))
            .collect();
        if set.is_empty() {
            return Cow::Borrowed(&self.budgets);
        }
        let mut all: Vec<TenantBudget> = self
            .budgets
            .iter()
            .filter(|b| !set.iter().any(|(t, _)| *t == b.tenant))
            .cloned()
            .collect();
        all.extend(
            set.into_iter()
                .map(|(t, rate)| TenantBudget::new(t, rate, self.shards)),
        );
        Cow::Owned(all)
    }

    /// The next batch's takes from what the last claim saw, and the
    /// budgets the script holds them to.
    fn plan(&self, limit: usize) -> (Vec<TenantTake>, f64, Cow<'_, [TenantBudget]>) {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let budgets = self.budgets(&seen);
        // A capped tenant's share is planned at no more than its budget
        // holds when full, so the rest of the batch goes to the others.
        let most_now = |tenant: &[u8]| {
            let b = budgets.iter().find(|b| b.tenant.as_bytes() == tenant)?;
            Some(b.burst)
        };
        let backlogs: Vec<share::Backlog> = seen
            .iter()
            .map(|t| share::Backlog {
                tenant: &t.tenant,
                due: most_now(&t.tenant).map_or(t.due, |most| t.due.min(most)),
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
        (takes, s.floor, budgets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(tenant: &str, due: u64, max_rate: Option<u32>) -> TenantDue {
        TenantDue {
            tenant: tenant.as_bytes().to_vec(),
            due,
            vtime: None,
            weight: None,
            max_rate,
        }
    }

    #[test]
    fn a_max_rate_set_at_run_time_replaces_the_configs_and_caps_the_planned_share() {
        let settings = Tenants {
            max_rates: [("acme".to_string(), 400), ("globex".to_string(), 1000)].into(),
            ..Tenants::default()
        };
        let fair = Fair::new(settings, 1);
        *fair.seen.lock().unwrap() = vec![
            due("acme", 500, Some(100)),
            due("globex", 500, None),
            due("initech", 500, Some(50)),
        ];
        let (takes, _, budgets) = fair.plan(300);
        let burst = |t: &str| budgets.iter().find(|b| b.tenant == t).map(|b| b.burst);
        // 100/s and 50/s hold 2 members when full; 1000/s (the config's) 20.
        assert_eq!(burst("acme"), Some(2));
        assert_eq!(burst("globex"), Some(20));
        assert_eq!(burst("initech"), Some(2));
        let take = |t: &str| {
            takes
                .iter()
                .find(|k| k.tenant == t.as_bytes())
                .map(|k| k.count)
        };
        assert_eq!(take("acme"), Some(2));
        assert_eq!(take("initech"), Some(2));
        assert_eq!(take("globex"), Some(20));
        // Reported without a run-time value, the config's cap is back.
        *fair.seen.lock().unwrap() = vec![due("acme", 500, None)];
        let (_, _, budgets) = fair.plan(300);
        assert_eq!(
            budgets.iter().find(|b| b.tenant == "acme").map(|b| b.burst),
            Some(8)
        );
    }
}
