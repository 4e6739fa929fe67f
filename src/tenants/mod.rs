//! Fair release among the tenants of a business (docs/tenants.md): each
//! claim moves due members out of the tenants' own sorted sets in weighted
//! fair shares, so one tenant's burst never makes another tenant's members
//! wait behind it. The choice is [`share::shares`], a pure function; the
//! Redis side is one script (`claim_tenants.lua`), which also keeps each
//! tenant's virtual time in Redis so several instances share one fairness.

pub mod share;
mod unconfirmed;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::Tenants;
use crate::store::{Claim, Claimed, Store, StoreError, TenantBudget, TenantDue, TenantTake};
pub use unconfirmed::{Slot, Unconfirmed};

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
    /// Each tenant's unconfirmed publishes, with `tenant_window` set.
    unconfirmed: Option<Arc<Unconfirmed>>,
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
        let unconfirmed = settings
            .window
            .map(|cap| Arc::new(Unconfirmed::new(u64::from(cap))));
        Self {
            settings,
            shards,
            budgets,
            seen: Mutex::default(),
            unconfirmed,
        }
    }

    /// Counts each claimed member against its tenant's `tenant_window`
    /// until its slot drops: one per member, `None` for a member of no
    /// tenant or where no window is set.
    pub fn hold(&self, members: &[Claimed]) -> Vec<Option<Slot>> {
        let Some(u) = &self.unconfirmed else {
            return Vec::new();
        };
        members
            .iter()
            .map(|c| c.tenant.as_ref().map(|t| u.take(t)))
            .collect()
    }

    /// Resolves when a tenant the last claim saw with due work has room
    /// under its `tenant_window` again; never without a window.
    ///
    /// A wake-up is stored when nobody waits, so one stored while a claim
    /// ran may find that claim took the room it announced: it is passed
    /// over (a claim then would move nothing), and the next confirm that
    /// frees the room wakes it again.
    pub async fn freed(&self) {
        let Some(u) = &self.unconfirmed else {
            return std::future::pending().await;
        };
        loop {
            u.freed().await;
            if self.has_due() {
                return;
            }
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
        let mut claim = self.claim_once(store, limit, lease, false).await?;
        if claim.members.is_empty() && !claim.paused && self.has_due() {
            claim = self.claim_once(store, limit, lease, false).await?;
        }
        Ok(claim)
    }

    /// Claims the first due member of each tenant the last claim did not
    /// see with due work, and nothing of the tenants it saw (each named as
    /// held): the express scanner's claim, which serves a tenant newly due
    /// while the other scanners work through a backlog, as fair queueing
    /// serves a tenant back from idle. Its report replaces the last one.
    pub async fn claim_fresh(
        &self,
        store: &Store,
        limit: usize,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim_once(store, limit, lease, true).await
    }

    /// One claim by the plan, or with `fresh` only of the tenants not
    /// [passed over](Fair::passed_over); its report is what was seen.
    async fn claim_once(
        &self,
        store: &Store,
        limit: usize,
        lease: Duration,
        fresh: bool,
    ) -> Result<Claim, StoreError> {
        let (mut takes, floor, budgets) = self.plan(limit);
        if fresh {
            takes = self
                .passed_over()
                .into_iter()
                .map(|tenant| TenantTake {
                    weight: self.settings.weight(&tenant),
                    tenant,
                    count: 0,
                    rest: false,
                    most: Some(0),
                })
                .collect();
        }
        let (claim, seen) = store
            .claim_tenants(limit, lease, &takes, (floor, REPORTED), &budgets)
            .await?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        Ok(claim)
    }

    /// Whether the last claim saw any tenant with due work: the scanners
    /// have a backlog to work through, and the express scanner watches
    /// for tenants newly due beside it.
    pub fn busy(&self) -> bool {
        !self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// What the express scanner leaves to the others: every tenant the
    /// last claim saw with due work, and every tenant at its
    /// `tenant_window`.
    pub fn passed_over(&self) -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|t| t.tenant.clone())
            .collect();
        all.extend(
            self.unconfirmed
                .iter()
                .flat_map(|u| u.full())
                .map(|t| t.to_vec()),
        );
        all.sort();
        all.dedup();
        all
    }

    /// The tenants the last claim saw with due work that it could not
    /// release: at their `tenant_window` or held to a `max_rate`. Their
    /// members are no news to a sleeping scanner: the window's wake-up
    /// ([`Fair::freed`]) and the claim's next due time answer for them.
    pub fn held(&self) -> Vec<Vec<u8>> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // The budgets the next claim holds tenants to, as `plan` sends them.
        let budgets = self.budgets(&seen);
        let full = |t: &[u8]| self.unconfirmed.as_ref().is_some_and(|u| u.room(t) == 0);
        let capped = |t: &[u8]| budgets.iter().any(|b| b.tenant.as_bytes() == t);
        seen.iter()
            .filter(|t| full(&t.tenant) || capped(&t.tenant))
            .map(|t| t.tenant.clone())
            .collect()
    }

    /// Whether the last claim saw a tenant with due work it may release.
    fn has_due(&self) -> bool {
        let room = |t: &[u8]| self.unconfirmed.as_ref().is_none_or(|u| u.room(t) > 0);
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|t| room(&t.tenant))
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
        // And one at its window at no more than the room it has left.
        let room = |tenant: &[u8]| self.unconfirmed.as_ref().map(|u| u.room(tenant));
        let backlogs: Vec<share::Backlog> = seen
            .iter()
            .map(|t| share::Backlog {
                tenant: &t.tenant,
                due: [most_now(&t.tenant), room(&t.tenant)]
                    .into_iter()
                    .flatten()
                    .fold(t.due, u64::min),
                vtime: t.vtime,
                weight: t.weight.unwrap_or_else(|| self.settings.weight(&t.tenant)),
            })
            .collect();
        let s = share::shares(&backlogs, limit as u64);
        let due: HashMap<&[u8], u64> = backlogs.iter().map(|b| (b.tenant, b.due)).collect();
        let mut takes: Vec<TenantTake> = s
            .counts
            .into_iter()
            .map(|(tenant, count)| TenantTake {
                tenant: tenant.to_vec(),
                count,
                rest: due.get(tenant).is_some_and(|&d| count >= d),
                // The script charges a weight set at run time in its place.
                weight: self.settings.weight(tenant),
                most: room(tenant),
            })
            .collect();
        // Those given all they had go first: a newly due tenant's first
        // member may already have taken part of the room, and what is short
        // then falls on the backlogged, for whom a claim later costs least.
        takes.sort_by_key(|t| !t.rest);
        // Tenants at their window are named, so the script neither gives
        // them the first member it gives a newly due tenant nor counts them
        // as the next due time.
        if let Some(u) = &self.unconfirmed {
            takes.extend(u.full().into_iter().map(|t| TenantTake {
                weight: self.settings.weight(&t),
                tenant: t.to_vec(),
                count: 0,
                rest: false,
                most: Some(0),
            }));
        }
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
        // 100 ms of 100/s, 1000/s (the config's) and 50/s when full.
        assert_eq!(burst("acme"), Some(10));
        assert_eq!(burst("globex"), Some(100));
        assert_eq!(burst("initech"), Some(5));
        let take = |t: &str| {
            takes
                .iter()
                .find(|k| k.tenant == t.as_bytes())
                .map(|k| k.count)
        };
        assert_eq!(take("acme"), Some(10));
        assert_eq!(take("initech"), Some(5));
        assert_eq!(take("globex"), Some(100));
        // Reported without a run-time value, the config's cap is back.
        *fair.seen.lock().unwrap() = vec![due("acme", 500, None)];
        let (_, _, budgets) = fair.plan(300);
        assert_eq!(
            budgets.iter().find(|b| b.tenant == "acme").map(|b| b.burst),
            Some(40)
        );
    }

    #[test]
    fn a_wake_up_whose_room_a_claim_took_again_does_not_end_the_wait() {
        let settings = Tenants {
            window: Some(1),
            ..Tenants::default()
        };
        let fair = Fair::new(settings, 1);
        *fair.seen.lock().unwrap() = vec![due("acme", 500, None)];
        let acme: Arc<[u8]> = Arc::from(&b"acme"[..]);
        let u = fair.unconfirmed.clone().unwrap();
        let now = |fair: &Fair| {
            let f = fair.freed();
            futures::pin_mut!(f);
            futures::FutureExt::now_or_never(f).is_some()
        };
        // A confirm frees acme's room (a wake-up is stored), then a claim
        // takes it again before the scanner waits.
        drop(u.take(&acme));
        let again = u.take(&acme);
        assert!(
            !now(&fair),
            "woken with no room: a claim would move nothing"
        );
        drop(again);
        assert!(now(&fair), "the confirm that frees the room wakes it");
    }

    #[test]
    fn a_tenant_given_all_it_had_is_named_before_the_backlogged_ones() {
        let fair = Fair::new(Tenants::default(), 1);
        // The heavy tenant's members finish first in virtual time, so the
        // share hands it out first; the light one was served just before.
        let mut light = due("light", 1, None);
        light.vtime = Some(5.0);
        let mut heavy = due("heavy", 500, None);
        heavy.vtime = Some(0.0);
        *fair.seen.lock().unwrap() = vec![heavy, light];
        let (takes, _, _) = fair.plan(10);
        let named: Vec<(&[u8], u64, bool)> = takes
            .iter()
            .map(|t| (&t.tenant[..], t.count, t.rest))
            .collect();
        assert_eq!(
            named,
            vec![(&b"light"[..], 1, true), (&b"heavy"[..], 9, false)]
        );
    }
}
