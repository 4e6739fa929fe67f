//! The bench's one report printer: every table starts with the same
//! heading and prints rows of label, value and note, with the figures
//! (medians, percentiles, per-round lists) formatted one way.

/// Prints a table's heading: what was run, and on which machine.
pub(super) fn heading(what: &str) {
    println!();
    println!("{what}");
    println!("machine: {}", machine());
    println!("{:-<78}", "");
}

/// One row of a table: label, value, note.
pub(super) fn row(label: &str, value: &str, note: &str) {
    println!("{label:<34} {value:>14}   {note}");
}

/// Per-round rates, as whole numbers.
pub(super) fn join_rates(v: &[f64]) -> String {
    join(v, 0)
}

/// Per-round ratios, to three places.
pub(super) fn join_ratios(v: &[f64]) -> String {
    join(v, 3)
}

/// Per-round microseconds, to one place.
pub(super) fn join_us(v: &[f64]) -> String {
    join(v, 1)
}

/// Figures joined by commas, each to `places` decimal places.
fn join(v: &[f64], places: usize) -> String {
    v.iter()
        .map(|r| format!("{r:.places$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The median; 0 for no figures.
pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        0.0
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    }
}

/// The `p` quantile of ascending, non-empty `sorted` (nearest rank).
pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

/// The machine the figures were measured on.
pub(super) fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores, {model}")
}
