//! `delayd bench --compare-shards N`: the same backlog drained from one key
//! and from a business of N shards, by the same delayd, alternately in each
//! round, with the script calls and the Redis time each drain cost, so what
//! sharding costs on one server is measured and not guessed.

use super::far_writes::{commandstats, script_calls};
use super::report::median;
use super::{delayd_drain, BenchError, CpuWatch};
use crate::redis_conn::RedisConn;
use crate::store::KeyFamily;

/// What each drain of the comparison takes.
#[derive(Clone, Copy)]
pub(super) struct Backlog {
    /// Members per drain.
    pub n: usize,
    /// Body size in bytes.
    pub size: usize,
    /// Whether the members are ids with their bodies in `{K}:body`.
    pub id_mode: bool,
}

/// One side of the comparison, over the rounds.
#[derive(Default)]
struct Side {
    rates: Vec<f64>,
    /// Script calls (claims, acks, extends) per 1,000 members drained.
    calls_per_1000: Vec<f64>,
    /// Redis time of those calls per member, µs.
    script_us: Vec<f64>,
}

/// The second business of the bench (`shards = N`) beside the first, and
/// what their drains measured.
pub(super) struct ShardCompare {
    /// Shards of the second business.
    pub shards: usize,
    backlog: Backlog,
    /// The one-key business's family.
    one: Vec<KeyFamily>,
    /// The sharded business's families.
    sharded: Vec<KeyFamily>,
    one_side: Side,
    sharded_side: Side,
    /// Sharded drain rate / one-key drain rate, per round.
    ratios: Vec<f64>,
}

impl ShardCompare {
    /// Compares `one` (the bench business) with `sharded`.
    pub fn new(
        shards: usize,
        backlog: Backlog,
        one: Vec<KeyFamily>,
        sharded: Vec<KeyFamily>,
    ) -> Self {
        ShardCompare {
            shards,
            backlog,
            one,
            sharded,
            one_side: Side::default(),
            sharded_side: Side::default(),
            ratios: Vec::new(),
        }
    }

    /// Drains the backlog from the one key, then from the shards.
    pub async fn round(
        &mut self,
        redis: &mut RedisConn,
        round: usize,
        watch: &CpuWatch,
    ) -> Result<(), BenchError> {
        let b = self.backlog;
        let one = drain(redis, &self.one, b, 1000 + round, watch, &mut self.one_side).await?;
        let sharded = drain(
            redis,
            &self.sharded,
            b,
            2000 + round,
            watch,
            &mut self.sharded_side,
        )
        .await?;
        eprintln!(
            "bench: round {round}: one key {one:.0} msg/s, {} shards {sharded:.0} msg/s, ratio {:.3}",
            self.shards,
            sharded / one
        );
        self.ratios.push(sharded / one);
        Ok(())
    }

    /// The table's rows, as (label, value, note).
    pub fn rows(&self) -> Vec<(String, String, String)> {
        let side = |s: &Side| {
            format!(
                "{:.0} msg/s, {:.1} script calls per 1,000 members, {:.1} µs of Redis script time per member",
                median(&s.rates),
                median(&s.calls_per_1000),
                median(&s.script_us)
            )
        };
        vec![
            (
                format!("{} shards / one key", self.shards),
                format!("{:.3}", median(&self.ratios)),
                format!(
                    "median of per-round ratios {}",
                    super::report::join_ratios(&self.ratios)
                ),
            ),
            ("  one key".into(), String::new(), side(&self.one_side)),
            (
                format!("  {} shards", self.shards),
                String::new(),
                side(&self.sharded_side),
            ),
        ]
    }
}

/// One drain of `fams`, recorded in `side`; returns its rate.
async fn drain(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    b: Backlog,
    round: usize,
    watch: &CpuWatch,
    side: &mut Side,
) -> Result<f64, BenchError> {
    let before = commandstats(redis).await?;
    let (rate, ..) = delayd_drain(redis, fams, b.n, b.size, round, b.id_mode, watch).await?;
    let n = b.n;
    let after = commandstats(redis).await?;
    let (calls, usec) = script_calls(&before, &after);
    side.rates.push(rate);
    side.calls_per_1000
        .push(calls as f64 * 1000.0 / n.max(1) as f64);
    side.script_us.push(usec as f64 / n.max(1) as f64);
    Ok(rate)
}
