//! A tenant's unconfirmed publishes on this instance (`tenant_window`):
//! counted from its members' claim until the broker answers for each, so
//! a tenant at its cap is held back from the next claims and the window
//! stays open to the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The counts of one key's tenants, and their cap.
#[derive(Debug)]
pub struct Unconfirmed {
    cap: u64,
    counts: Mutex<HashMap<Arc<[u8]>, u64>>,
    freed: Notify,
}

impl Unconfirmed {
    /// Counts against a cap of `cap` unconfirmed publishes per tenant.
    pub fn new(cap: u64) -> Self {
        Self {
            cap: cap.max(1),
            counts: Mutex::default(),
            freed: Notify::new(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<[u8]>, u64>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many more members `tenant` may have in flight now.
    pub fn room(&self, tenant: &[u8]) -> u64 {
        let held = self.counts().get(tenant).copied().unwrap_or(0);
        self.cap.saturating_sub(held)
    }

    /// The tenants at their cap.
    pub fn full(&self) -> Vec<Arc<[u8]>> {
        self.counts()
            .iter()
            .filter(|(_, n)| **n >= self.cap)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Counts one claimed member of `tenant` until the returned slot drops.
    pub fn take(self: &Arc<Self>, tenant: &Arc<[u8]>) -> Slot {
        *self.counts().entry(tenant.clone()).or_insert(0) += 1;
        Slot {
            of: self.clone(),
            tenant: tenant.clone(),
        }
    }

    /// Resolves once a tenant at its cap has room again (a permit is kept
    /// when nobody waits, so a release between two waits is not lost).
    pub async fn freed(&self) {
        self.freed.notified().await
    }

    fn release(&self, tenant: &[u8]) {
        let mut counts = self.counts();
        let Some(n) = counts.get_mut(tenant) else {
            return;
        };
        // Two scanners' claims can each take the room one count showed, so
        // a tenant can stand over its cap: only the release that brings it
        // below the cap wakes a claim. A wake-up at every release over the
        // cap would run a claim with no room, once per confirm.
        let freed = *n == self.cap;
        *n -= 1;
        if *n == 0 {
            counts.remove(tenant);
        }
        drop(counts);
        if freed {
            self.freed.notify_one();
        }
    }
}

/// One unconfirmed publish of a tenant; dropped once the broker answered
/// for it (or it went back unpublished).
#[derive(Debug)]
pub struct Slot {
    of: Arc<Unconfirmed>,
    tenant: Arc<[u8]>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.of.release(&self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_full_at_its_cap_and_has_room_again_when_a_slot_drops() {
        let u = Arc::new(Unconfirmed::new(2));
        let acme: Arc<[u8]> = Arc::from(&b"acme"[..]);
        let a = u.take(&acme);
        assert_eq!(u.room(b"acme"), 1);
        let b = u.take(&acme);
        assert_eq!(u.room(b"acme"), 0);
        assert_eq!(u.full(), vec![acme.clone()]);
        assert_eq!(u.room(b"globex"), 2, "another tenant has its own cap");
        drop(a);
        assert_eq!(u.room(b"acme"), 1);
        assert!(u.full().is_empty());
        // The drop from full stored a wake-up for the claim that waits.
        let freed = u.freed();
        futures::pin_mut!(freed);
        assert!(futures::FutureExt::now_or_never(freed).is_some());
        drop(b);
        assert!(u.counts().is_empty(), "an idle tenant is forgotten");
    }

    #[test]
    fn a_tenant_over_its_cap_wakes_a_claim_only_once_it_has_room() {
        let u = Arc::new(Unconfirmed::new(2));
        let acme: Arc<[u8]> = Arc::from(&b"acme"[..]);
        let mut slots: Vec<Slot> = (0..4).map(|_| u.take(&acme)).collect();
        let woken = |u: &Unconfirmed| {
            let freed = u.freed();
            futures::pin_mut!(freed);
            futures::FutureExt::now_or_never(freed).is_some()
        };
        slots.pop();
        assert_eq!(u.room(b"acme"), 0);
        assert!(!woken(&u), "3 of 2 in flight: no room, no wake-up");
        slots.pop();
        assert!(!woken(&u), "2 of 2 in flight: no room, no wake-up");
        slots.pop();
        assert_eq!(u.room(b"acme"), 1);
        assert!(woken(&u), "1 of 2 in flight: room, one wake-up");
        assert!(!woken(&u), "and only one");
    }
}
