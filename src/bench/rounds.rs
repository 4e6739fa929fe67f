//! The figures of the ceiling-then-drain rounds, one record per round, so
//! every row of the table is a median (or a list) over the same rounds.

use super::report::median;

/// What one round measured.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Round {
    /// Raw confirmed publish, messages/s: the ceiling.
    pub raw: f64,
    /// Raw publish with delayd's message format, messages/s.
    pub same: f64,
    /// delayd's drain, messages/s.
    pub drain: f64,
    /// Redis memory per pending task of the loaded backlog, bytes.
    pub bytes_per_task: f64,
    /// delayd's CPU per drained member, µs.
    pub cpu_daemon: f64,
    /// Redis masters' and replicas' CPU per drained member, µs, when their
    /// processes are on this machine.
    pub cpu_redis: Option<(f64, f64)>,
}

impl Round {
    /// The drain against the ceiling.
    pub fn ratio(&self) -> f64 {
        self.drain / self.raw
    }

    /// The drain against a publisher sending delayd's own format.
    pub fn same_ratio(&self) -> f64 {
        self.drain / self.same
    }
}

/// Every round of one run.
#[derive(Default)]
pub(super) struct Rounds(Vec<Round>);

impl Rounds {
    /// Adds a finished round.
    pub fn push(&mut self, round: Round) {
        self.0.push(round);
    }

    /// How many rounds ran.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// One figure of every round, in order.
    pub fn each(&self, figure: impl Fn(&Round) -> f64) -> Vec<f64> {
        self.0.iter().map(figure).collect()
    }

    /// The median of one figure over the rounds.
    pub fn median(&self, figure: impl Fn(&Round) -> f64) -> f64 {
        median(&self.each(figure))
    }

    /// Redis's CPU per member of every round, when it could be read.
    pub fn cpu_redis(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let known: Vec<(f64, f64)> = self.0.iter().filter_map(|r| r.cpu_redis).collect();
        (!known.is_empty()).then(|| known.into_iter().unzip())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios_come_from_the_same_rounds() {
        let mut rounds = Rounds::default();
        for (raw, drain) in [(100.0, 90.0), (200.0, 100.0), (100.0, 80.0)] {
            rounds.push(Round {
                raw,
                same: raw,
                drain,
                ..Round::default()
            });
        }
        assert_eq!(rounds.len(), 3);
        assert_eq!(rounds.median(|r| r.raw), 100.0);
        assert_eq!(rounds.each(Round::ratio), vec![0.9, 0.5, 0.8]);
        assert_eq!(rounds.median(Round::ratio), 0.8);
        assert!(rounds.cpu_redis().is_none());
    }
}
