//! The figures of `--fair` and its table: each class's lateness, the heavy
//! tenant's drain with tenants against without, and the weighted share.

use super::fair_sizes::FairSizes;
use super::report::{heading, percentile, row};

/// What one burst pass measured. Lateness is receipt at the bench consumer
/// minus due time, ms on Redis's clock, sorted.
pub(super) struct Burst {
    pub heavy: Vec<f64>,
    pub light: Vec<f64>,
    /// The light members at delayd's release (`fair_release`).
    pub released: super::fair_release::Released,
    /// Light members written (all due as written).
    pub light_written: usize,
    /// Heavy members still pending at the end of the window, cancelled.
    pub cancelled: u64,
    /// How long after its due time the burst was in place (0 when staged
    /// ahead, as it should be).
    pub staged_late: i64,
    /// The window, seconds from the burst's due time.
    pub secs: u64,
}

impl Burst {
    /// The heavy tenant's members per second from its due time: all of them
    /// over its last receipt when it drained within the window, else those
    /// received within the window over the window.
    pub fn drain(&self) -> f64 {
        rate_until(&self.heavy, self.secs as f64 * 1000.0)
    }
}

/// Members received by `end_ms` after their due time, per second of it;
/// `end_ms` is cut to the last receipt when every member came before it.
fn rate_until(sorted: &[f64], end_ms: f64) -> f64 {
    let end = sorted.last().map_or(end_ms, |last| last.min(end_ms));
    let n = sorted.partition_point(|l| *l <= end);
    if end <= 0.0 {
        return 0.0;
    }
    n as f64 * 1000.0 / end
}

/// One burst pass and the business it ran on.
pub(super) struct Pass {
    pub tenants: bool,
    pub max_rate: Option<u32>,
    /// The business's `tenant_window`, if set.
    pub window: Option<u32>,
    pub burst: Burst,
}

/// Two saturated tenants' shares while both had due members.
pub(super) struct Share {
    pub weights: (u32, u32),
    /// Members of each received while both were backlogged.
    pub counts: (usize, usize),
    /// How long both were backlogged, ms from the due time.
    pub both_ms: f64,
}

impl Share {
    /// The shares of `a` and `b` (lateness, sorted) until the first of them
    /// drained, or the window of `secs` ended.
    pub fn new(a: Vec<f64>, b: Vec<f64>, weights: (u32, u32), secs: u64) -> Self {
        let last = |v: &[f64]| v.last().copied().unwrap_or(0.0);
        let both_ms = last(&a).min(last(&b)).min(secs as f64 * 1000.0);
        let upto = |v: &[f64]| v.partition_point(|l| *l <= both_ms);
        Share {
            weights,
            counts: (upto(&a), upto(&b)),
            both_ms,
        }
    }

    /// The measured share of `a` over `b`.
    pub fn ratio(&self) -> f64 {
        self.counts.0 as f64 / self.counts.1.max(1) as f64
    }

    /// The measured ratio against the configured one, minus 1.
    pub fn error(&self) -> f64 {
        self.ratio() / (self.weights.0 as f64 / self.weights.1 as f64) - 1.0
    }
}

/// A saturated tenant with a `max_rate` beside one without, both due at
/// once: each one's release rate, read from its set's size on Redis's clock.
pub(super) struct Capped {
    /// The capped tenant's `max_rate`.
    pub rate: u32,
    /// Its members released per second from 1 s into its drain to the end
    /// of the window (or its last member).
    pub released: f64,
    /// The uncapped tenant's, over its whole drain within the window.
    pub uncapped: f64,
}

/// Members per second that left a set of `total` between `skip` seconds
/// after the first left and its last member or the last sample, from
/// `(seconds, size)` samples in time order; 0 without two such samples.
pub(super) fn released_rate(samples: &[(f64, i64)], total: i64, skip: f64) -> f64 {
    let Some(first) = samples.iter().position(|(_, n)| *n < total) else {
        return 0.0;
    };
    let from = if skip > 0.0 {
        let t0 = samples[first].0;
        samples.iter().position(|(t, _)| *t >= t0 + skip)
    } else {
        Some(first.saturating_sub(1))
    };
    let to = samples
        .iter()
        .position(|(_, n)| *n == 0)
        .unwrap_or(samples.len() - 1);
    match from {
        Some(a) if a < to => {
            let ((ta, na), (tb, nb)) = (samples[a], samples[to]);
            (na - nb) as f64 / (tb - ta)
        }
        _ => 0.0,
    }
}

/// Prints the table: each pair of passes, the shares, the capped tenant.
pub(super) fn print(
    sizes: &FairSizes,
    size: usize,
    passes: &[Pass],
    (share, capped): (&Share, &Capped),
) {
    heading(&format!(
        "delayd bench --fair: a heavy tenant's {} members due at once, {} light tenants at {}/s due as written, {} s windows, {size}-byte bodies, one consumer",
        sizes.heavy, sizes.light_tenants, sizes.light_rate, sizes.secs
    ));
    for pass in passes {
        pass_rows(pass);
    }
    // Each pass with tenants against the pass without of its max_rate.
    for pass in passes.iter().filter(|p| p.tenants) {
        let Some(plain) = passes
            .iter()
            .find(|p| !p.tenants && p.max_rate == pass.max_rate)
        else {
            continue;
        };
        let ratio = pass.burst.drain() / plain.burst.drain().max(1.0);
        row(
            &format!("heavy drain, tenants / none, {}", rate_label(pass)),
            &format!("{ratio:.3}"),
            "goal >= 0.9",
        );
    }
    row(
        &format!(
            "weights {}:{}, measured share",
            share.weights.0, share.weights.1
        ),
        &format!("{:.2}:1", share.ratio()),
        &format!(
            "{:+.1}% off; {} and {} members over {:.0} ms, both backlogged; goal within 10%",
            share.error() * 100.0,
            share.counts.0,
            share.counts.1,
            share.both_ms
        ),
    );
    row(
        &format!("tenant max_rate {}, released", capped.rate),
        &format!("{:.0} /s", capped.released),
        &format!(
            "{:+.1}% off (from 1 s into its drain, at release); goal within 5%",
            (capped.released / capped.rate as f64 - 1.0) * 100.0
        ),
    );
    row(
        "uncapped tenant beside it, released",
        &format!("{:.0} /s", capped.uncapped),
        "over its drain, at release",
    );
}

fn rate_label(pass: &Pass) -> String {
    let rate = match pass.max_rate {
        Some(r) => format!("max_rate {r}"),
        None => "no max_rate".into(),
    };
    match pass.window {
        Some(w) => format!("{rate}, tenant_window {w}"),
        None => rate,
    }
}

/// The p99 of ascending `sorted`, 0 when it is empty.
fn p99(sorted: &[f64]) -> f64 {
    match sorted.is_empty() {
        true => 0.0,
        false => super::report::percentile(sorted, 0.99),
    }
}

/// A pass's rows: light and heavy lateness, the heavy drain.
fn pass_rows(pass: &Pass) {
    let b = &pass.burst;
    let on = format!(
        "{}, {}",
        if pass.tenants {
            "tenants"
        } else {
            "no tenants"
        },
        rate_label(pass)
    );
    lateness_row(
        &format!("{on}: light, at the consumer"),
        &b.light,
        &received(&b.light, b.light_written),
    );
    lateness_row(
        &format!("{on}: light, at release"),
        &b.released.late_ms,
        &format!(
            "Redis's clock, snapshots p99 {:.0} ms apart; writes ran p99 {:.0} ms after due (counted from then); {} heavy members released past a due light one",
            p99(&b.released.gaps_ms),
            p99(&b.released.write_late_ms),
            b.released.passed_over
        ),
    );
    lateness_row(
        &format!("{on}: heavy"),
        &b.heavy,
        &received(&b.heavy, b.heavy.len()),
    );
    let mut note = format!(
        "heavy members/s; {} cancelled after the window",
        b.cancelled
    );
    if b.staged_late > 0 {
        note.push_str(&format!(
            "; the burst was staged {} ms after its due time",
            b.staged_late
        ));
    }
    row(
        &format!("{on}: heavy drain"),
        &format!("{:.0} /s", b.drain()),
        &note,
    );
}

/// A lateness row: p99, then p50 and max, then `tail`.
fn lateness_row(label: &str, sorted: &[f64], tail: &str) {
    if sorted.is_empty() {
        row(label, "no samples", "");
        return;
    }
    row(
        label,
        &format!("p99 {:.1} ms", percentile(sorted, 0.99)),
        &format!(
            "p50 {:.1} ms, max {:.1} ms; {tail}",
            percentile(sorted, 0.50),
            sorted.last().copied().unwrap_or(0.0),
        ),
    );
}

/// `n of sent received`, for a row taken at the consumer.
fn received(sorted: &[f64], sent: usize) -> String {
    format!("{} of {sent} received", sorted.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_counts_the_window_or_the_whole_burst() {
        // Drained within the window: all members over the last receipt.
        assert_eq!(rate_until(&[100.0, 500.0, 1000.0], 5000.0), 3.0);
        // Not drained: only the window's members, over the window.
        assert_eq!(rate_until(&[100.0, 500.0, 1000.0, 6000.0], 2000.0), 1.5);
    }

    #[test]
    fn a_release_rate_is_read_between_the_skip_and_the_last_member() {
        // 100 members, 10 a second from t = 1.0, sampled each half second.
        let samples: Vec<(f64, i64)> = (0..30)
            .map(|i| {
                let t = i as f64 * 0.5;
                (t, (100 - ((t - 1.0).max(0.0) * 10.0) as i64).max(0))
            })
            .collect();
        assert!((released_rate(&samples, 100, 1.0) - 10.0).abs() < 1e-9);
        assert!((released_rate(&samples, 100, 0.0) - 10.0).abs() < 1e-9);
        assert_eq!(
            released_rate(&samples[..2], 100, 0.0),
            0.0,
            "nothing released"
        );
    }

    #[test]
    fn shares_count_only_while_both_are_backlogged() {
        let a: Vec<f64> = (1..=300).map(|i| i as f64).collect();
        let b: Vec<f64> = (1..=200).map(|i| i as f64 * 3.0).collect();
        let s = Share::new(a, b, (3, 1), 10);
        // a drained at 300 ms: b had 100 members by then.
        assert_eq!(s.counts, (300, 100));
        assert!(s.error().abs() < 1e-9);
    }
}
