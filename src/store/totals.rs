//! One business's counts summed over its shards, as `delayd inspect` and
//! the console's overview show them.

use super::{Paused, Stats, FORECAST_WINDOWS};

/// The counts of one key family that add up over a business's shards, as
/// the totals and the metrics scrape sum them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Members in `K` (and the counted tenants' sets).
    pub pending: u64,
    /// Of them, those due now.
    pub due_now: u64,
    /// Members claimed and awaiting a confirm.
    pub in_flight: u64,
    /// Dead members.
    pub dead: u64,
    /// Pending members due within each of [`FORECAST_WINDOWS`] from now,
    /// overdue ones included: what is coming, before it comes.
    pub due_within: [u64; FORECAST_WINDOWS.len()],
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.pending += other.pending;
        self.due_now += other.due_now;
        self.in_flight += other.in_flight;
        self.dead += other.dead;
        for (sum, n) in self.due_within.iter_mut().zip(other.due_within) {
            *sum += n;
        }
    }
}

/// Per-business totals over its shards.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Totals {
    /// The business.
    pub business: String,
    /// Members pending.
    pub pending: u64,
    /// Pending members due now.
    pub due_now: u64,
    /// Age of the oldest overdue member, ms.
    pub oldest_overdue_ms: Option<i64>,
    /// Time until the next member not yet due, ms.
    pub next_due_in_ms: Option<i64>,
    /// Members claimed and awaiting a confirm.
    pub in_flight: u64,
    /// Dead members.
    pub dead: u64,
    /// Pending members due within each of [`super::FORECAST_WINDOWS`].
    #[serde(skip)]
    pub due_within: [u64; 3],
    /// Set while an operator has paused the business (its earliest pause).
    pub paused: Option<Paused>,
    /// Tenants whose members the counts leave out: beyond the
    /// [`super::STATS_TENANTS`] due earliest on a key (0 almost always).
    pub tenants_uncounted: u64,
}

impl Totals {
    /// The totals of `name`'s shards, one [`Stats`] each.
    pub fn of(name: &str, all: &[Stats]) -> Self {
        let mut counts = Counts::default();
        let mut out = Totals {
            business: name.to_string(),
            ..Default::default()
        };
        for s in all {
            counts += s.counts;
            out.tenants_uncounted += s.tenants.saturating_sub(s.tenants_counted);
            if let Some(o) = s.oldest_due_ms {
                let age = (s.now_ms as f64 - o).max(0.0) as i64;
                out.oldest_overdue_ms = Some(out.oldest_overdue_ms.map_or(age, |a| a.max(age)));
            }
            if let Some(p) = &s.paused {
                if out.paused.as_ref().is_none_or(|q| p.since_ms < q.since_ms) {
                    out.paused = Some(p.clone());
                }
            }
            if let Some(n) = s.next_due_ms {
                let inn = (n - s.now_ms as f64).max(0.0).min(i64::MAX as f64) as i64;
                out.next_due_in_ms = Some(out.next_due_in_ms.map_or(inn, |a| a.min(inn)));
            }
        }
        Totals {
            pending: counts.pending,
            due_now: counts.due_now,
            in_flight: counts.in_flight,
            dead: counts.dead,
            due_within: counts.due_within,
            ..out
        }
    }
}
