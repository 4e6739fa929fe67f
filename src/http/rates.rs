//! Rates (claimed, confirmed, retried, dead-lettered, taken in and
//! rejected by the intake per second) and
//! lateness quantiles over about the last minute, from this process's own
//! counters: sampled every few seconds, never read from Redis.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Weak;
use std::time::{Duration, Instant};

use prometheus::core::Collector;

use super::HttpState;
use crate::telemetry::METRICS;

/// Samples kept: with one every 5 s, the rates cover the last minute.
const KEEP: usize = 13;

/// One business's counters at one moment.
#[derive(Debug, Clone, Default)]
struct Counts {
    claimed: u64,
    confirmed: u64,
    retried: u64,
    dead_lettered: u64,
    /// Intake messages stored and acknowledged.
    taken_in: u64,
    /// Intake messages rejected (dead-letter exchange or dead set).
    rejected: u64,
    /// Lateness histogram: cumulative count per upper bound (seconds).
    lateness: Vec<(f64, u64)>,
}

/// The counters at one moment, per business.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    counts: BTreeMap<String, Counts>,
}

/// The recent samples.
#[derive(Default)]
pub struct Sampler {
    samples: std::sync::Mutex<VecDeque<Sample>>,
}

/// One business's rates and lateness, as the overview shows them.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Rates {
    /// Seconds the rates cover (0: no earlier sample yet, rates are null).
    pub window_s: f64,
    /// Members claimed per second.
    pub claimed_per_s: Option<f64>,
    /// Members confirmed by the broker per second.
    pub confirmed_per_s: Option<f64>,
    /// Members rescheduled with backoff per second.
    pub retried_per_s: Option<f64>,
    /// Members moved to the dead set per second.
    pub dead_lettered_per_s: Option<f64>,
    /// Intake messages taken in (stored and acknowledged) per second.
    pub taken_in_per_s: Option<f64>,
    /// Intake messages rejected per second.
    pub rejected_per_s: Option<f64>,
    /// Median time from due to confirm, ms, over the window.
    pub lateness_p50_ms: Option<f64>,
    /// 99th percentile time from due to confirm, ms, over the window.
    pub lateness_p99_ms: Option<f64>,
}

impl Sampler {
    fn push(&self, s: Sample) {
        let mut q = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(s);
        while q.len() > KEEP {
            q.pop_front();
        }
    }

    /// Rates of `business` from the oldest kept sample to now.
    pub fn rates(&self, business: &str) -> Rates {
        let oldest = {
            let q = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            q.front().cloned()
        };
        let now = take();
        let (Some(then), Some(cur)) = (oldest, now.counts.get(business)) else {
            return Rates::default();
        };
        let dt = now.at.duration_since(then.at).as_secs_f64();
        if dt < 1.0 {
            return Rates::default();
        }
        let before = then.counts.get(business).cloned().unwrap_or_default();
        let per_s = |a: u64, b: u64| Some(a.saturating_sub(b) as f64 / dt);
        let delta: Vec<(f64, u64)> = cur
            .lateness
            .iter()
            .enumerate()
            .map(|(i, (ub, n))| {
                let was = before.lateness.get(i).map_or(0, |b| b.1);
                (*ub, n.saturating_sub(was))
            })
            .collect();
        Rates {
            window_s: (dt * 10.0).round() / 10.0,
            claimed_per_s: per_s(cur.claimed, before.claimed),
            confirmed_per_s: per_s(cur.confirmed, before.confirmed),
            retried_per_s: per_s(cur.retried, before.retried),
            dead_lettered_per_s: per_s(cur.dead_lettered, before.dead_lettered),
            taken_in_per_s: per_s(cur.taken_in, before.taken_in),
            rejected_per_s: per_s(cur.rejected, before.rejected),
            lateness_p50_ms: quantile(&delta, 0.5).map(|s| s * 1000.0),
            lateness_p99_ms: quantile(&delta, 0.99).map(|s| s * 1000.0),
        }
    }
}

/// Samples the counters every `period` while the server is up.
pub async fn sample_every(period: Duration, state: Weak<HttpState>) {
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else { return };
        state.rates.push(take());
    }
}

/// The counters now.
fn take() -> Sample {
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    let mut add = |vec: &prometheus::IntCounterVec, field: fn(&mut Counts) -> &mut u64| {
        for (business, v) in by_business(vec) {
            *field(counts.entry(business).or_default()) += v;
        }
    };
    add(&METRICS.claimed, |c| &mut c.claimed);
    add(&METRICS.confirmed, |c| &mut c.confirmed);
    add(&METRICS.retried, |c| &mut c.retried);
    add(&METRICS.dead_lettered, |c| &mut c.dead_lettered);
    add(&METRICS.intake.stored, |c| &mut c.taken_in);
    add(&METRICS.intake.rejected, |c| &mut c.rejected);
    for family in METRICS.lateness.collect() {
        for m in family.get_metric() {
            let Some(business) = label(m, "business") else {
                continue;
            };
            let h = m.get_histogram();
            let mut buckets: Vec<(f64, u64)> = h
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count()))
                .collect();
            buckets.push((f64::INFINITY, h.get_sample_count()));
            counts.entry(business).or_default().lateness = buckets;
        }
    }
    Sample {
        at: Instant::now(),
        counts,
    }
}

/// A counter summed over its other labels, per business.
fn by_business(vec: &prometheus::IntCounterVec) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in vec.collect() {
        for m in family.get_metric() {
            if let Some(business) = label(m, "business") {
                *out.entry(business).or_default() += m.get_counter().get_value() as u64;
            }
        }
    }
    out
}

fn label(m: &prometheus::proto::Metric, name: &str) -> Option<String> {
    m.get_label()
        .iter()
        .find(|l| l.name() == name)
        .map(|l| l.value().to_string())
}

/// The `q` quantile of a cumulative histogram, interpolated inside its
/// bucket as Prometheus's `histogram_quantile` does; `None` when empty.
/// A quantile in the last, unbounded bucket is reported as the highest
/// finite bound.
fn quantile(cumulative: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut prev = (0.0, 0u64);
    for &(ub, n) in cumulative {
        if n as f64 >= rank {
            if ub.is_infinite() {
                return Some(prev.0);
            }
            let in_bucket = (n - prev.1) as f64;
            let frac = if in_bucket > 0.0 {
                (rank - prev.1 as f64) / in_bucket
            } else {
                0.0
            };
            return Some(prev.0 + (ub - prev.0) * frac);
        }
        prev = (ub, n);
    }
    Some(prev.0)
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        // 100 samples: 50 under 10 ms, 49 more under 100 ms, 1 above 1 s.
        let h = [(0.01, 50), (0.1, 99), (1.0, 99), (f64::INFINITY, 100)];
        assert_eq!(quantile(&h, 0.5), Some(0.01));
        let p99 = quantile(&h, 0.99).unwrap();
        assert!((p99 - 0.1).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(&h, 1.0), Some(1.0));
        assert_eq!(quantile(&[(0.01, 0), (f64::INFINITY, 0)], 0.5), None);
    }
}
