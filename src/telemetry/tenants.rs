//! Per-tenant gauges of a business with tenants, read at scrape time and
//! bounded: the [`TOP`] tenants with the most pending members among those a
//! listing reads, the rest added up as tenant `other`, so a million
//! tenants make at most `TOP + 1` series per gauge and business.

use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use crate::tasks::tenants::{TenantList, TenantView};

/// Tenants shown by name per business; the others are `other`.
pub const TOP: usize = 10;

/// The tenant label of the tenants not shown by name.
pub const OTHER: &str = "other";

/// The per-tenant gauges.
pub struct Metrics {
    /// Members waiting in the tenant's sets.
    pub pending: IntGaugeVec,
    /// Of them, due now.
    pub due: IntGaugeVec,
    /// Age of the tenant's oldest due member.
    pub oldest_overdue: GaugeVec,
    /// 1 while an operator has paused the tenant.
    pub paused: IntGaugeVec,
    /// Members released from the tenant's sets in the last whole second.
    pub released: IntGaugeVec,
    /// Tenants with pending members, and paused tenants, per business.
    pub tenants: IntGaugeVec,
}

impl Metrics {
    /// The gauges, registered in `r`.
    pub fn new(r: &Registry) -> Self {
        let bt = &["business", "tenant"];
        let int = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            r.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let oldest_overdue = GaugeVec::new(
            Opts::new(
                "delayd_tenant_oldest_overdue_seconds",
                "Age of the tenant's oldest due member still in its set (top tenants by pending; the rest as tenant=\"other\", their largest)",
            ),
            bt,
        )
        .expect("valid metric");
        r.register(Box::new(oldest_overdue.clone()))
            .expect("unique metric");
        Self {
            pending: int(
                "delayd_tenant_pending",
                "Members waiting in the tenant's sets (the top tenants by pending; the rest added up as tenant=\"other\")",
                bt,
            ),
            due: int(
                "delayd_tenant_due",
                "Of the tenant's pending members, those due now (tenants as delayd_tenant_pending)",
                bt,
            ),
            oldest_overdue,
            paused: int(
                "delayd_tenant_paused",
                "1 while an operator has paused the tenant (tenants as delayd_tenant_pending; other: 1 if any of them is paused)",
                bt,
            ),
            released: int(
                "delayd_tenant_released_per_second",
                "Members claims released from the tenant's sets in the last whole second (tenants as delayd_tenant_pending; other: added up)",
                bt,
            ),
            tenants: int(
                "delayd_tenants",
                "Tenants of the business, by state: pending (with members in their sets) or paused",
                &["business", "state"],
            ),
        }
    }

    /// Forgets every tenant series, before a scrape sets them afresh: a
    /// tenant that left the top, or a business not read this time, is no
    /// longer shown.
    pub fn reset(&self) {
        for g in [
            &self.pending,
            &self.due,
            &self.paused,
            &self.released,
            &self.tenants,
        ] {
            g.reset();
        }
        self.oldest_overdue.reset();
    }

    /// Sets `business`'s gauges from a listing.
    pub fn set(&self, business: &str, list: &TenantList) {
        let mut rows: Vec<&TenantView> = list.rows.iter().collect();
        rows.sort_by(|a, b| b.pending.cmp(&a.pending).then(a.tenant.cmp(&b.tenant)));
        let (top, rest) = rows.split_at(rows.len().min(TOP));
        for r in top {
            self.row(business, &r.tenant, &Sums::of(std::slice::from_ref(r)));
        }
        if !rest.is_empty() {
            self.row(business, OTHER, &Sums::of(rest));
        }
        let state = |s: &str| self.tenants.with_label_values(&[business, s]);
        state("pending").set(list.tenants as i64);
        state("paused").set(list.paused as i64);
    }

    fn row(&self, business: &str, tenant: &str, v: &Sums) {
        let l = [business, tenant];
        self.pending.with_label_values(&l).set(v.pending as i64);
        self.due.with_label_values(&l).set(v.due as i64);
        self.oldest_overdue
            .with_label_values(&l)
            .set(v.overdue_ms as f64 / 1000.0);
        self.paused.with_label_values(&l).set(v.paused as i64);
        self.released.with_label_values(&l).set(v.released as i64);
    }
}

/// One series' values: a tenant's, or the rest's added up (the oldest
/// overdue their largest, paused if any is).
struct Sums {
    pending: u64,
    due: u64,
    overdue_ms: u64,
    paused: bool,
    released: u64,
}

impl Sums {
    fn of(rows: &[&TenantView]) -> Self {
        Self {
            pending: rows.iter().map(|r| r.pending).sum(),
            due: rows.iter().map(|r| r.due).sum(),
            overdue_ms: rows.iter().map(|r| r.oldest_overdue_ms).max().unwrap_or(0),
            paused: rows.iter().any(|r| r.paused.is_some()),
            released: rows.iter().map(|r| r.released_per_s).sum(),
        }
    }
}
