//! A producer's pace: so many members a second for so long, caught up on
//! each tick, as a steady stream of producers would write them.

use std::time::{Duration, Instant};

/// Paces writes at `rate` members a second for `secs` seconds: each tick
/// says how many should be written by then.
pub(super) struct Pace {
    rate: f64,
    total: usize,
    started: Instant,
    tick: tokio::time::Interval,
}

impl Pace {
    /// `rate` members a second for `secs` seconds, caught up every `every`.
    pub(super) fn new(rate: u32, secs: u64, every: Duration) -> Self {
        Self {
            rate: rate as f64,
            total: (rate as u64 * secs) as usize,
            started: Instant::now(),
            tick: tokio::time::interval(every),
        }
    }

    /// How many members the whole run writes.
    pub(super) fn total(&self) -> usize {
        self.total
    }

    /// Waits for the next tick and says how many members should be written
    /// by now; `None` once `written` reaches the total.
    pub(super) async fn upto(&mut self, written: usize) -> Option<usize> {
        if written >= self.total {
            return None;
        }
        self.tick.tick().await;
        let due = (self.started.elapsed().as_secs_f64() * self.rate) as usize;
        Some(due.min(self.total))
    }
}
