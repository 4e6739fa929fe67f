//! A business's `max_rate`: a token bucket in this process, or, with
//! `max_rate_scope = "cluster"`, one budget in Redis that every process and
//! every shard of the business draws from.
//!
//! Tokens are taken before a claim, for as many members as the claim asks
//! for, and the ones the claim did not use are given back, so the budget is
//! spent on members actually claimed.

use crate::redis_conn::scripts;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Business, RateScope};
use crate::redis_conn::RedisConn;
use crate::store::StoreError;

/// Publishes-per-second limiter of one process.
type ProcessBucket = governor::DefaultDirectRateLimiter;

/// The Redis key of a business's shared budget: `{K}:rate`, or `K:rate`
/// when `K` carries a hash tag, beside the family of an unsharded `K`.
pub fn rate_key(key: &str) -> String {
    crate::keys::KeyFamily::new(key).rate()
}

/// What a take from the budget gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// This many members may be claimed now.
    Granted(usize),
    /// Too few tokens are free: ask again after this long.
    Wait(Duration),
}

/// The publish-rate cap of one business, shared by its scanners and shards.
pub enum Limiter {
    /// A bucket in this process, and the fewest tokens worth a claim.
    Process(ProcessBucket, usize),
    /// A budget in Redis, shared with every other process.
    Shared(SharedBudget),
}

/// A GCRA budget kept in Redis (see `lua/rate.lua`).
pub struct SharedBudget {
    conn: RedisConn,
    key: String,
    interval_us: f64,
    /// The fewest tokens worth a claim: about 20 ms of the rate, so a fast
    /// budget is not spent in claims of one member each.
    least: usize,
}

impl Limiter {
    /// The limiter `business` asks for, if it sets `max_rate`, and the most
    /// tokens one take may ask for. Bursts no larger than a batch keep the
    /// pace even within a second.
    pub fn for_business(business: &Business, conn: &RedisConn) -> Option<(Arc<Self>, usize)> {
        let rate = business.max_rate?;
        let burst = (rate as usize).min(business.batch_size).max(1);
        // About 20 ms of the rate: a claim waits for no more, so a member
        // that falls due behind a backlog waits tens of ms, not a batch's
        // worth of the rate (256 at 2,000/s: 128 ms).
        let least = (rate as usize / 50).clamp(1, burst);
        let limiter = match business.max_rate_scope {
            RateScope::Process => {
                let quota = governor::Quota::per_second(NonZeroU32::new(rate)?)
                    .allow_burst(NonZeroU32::new(burst as u32)?);
                Limiter::Process(governor::RateLimiter::direct(quota), least)
            }
            RateScope::Cluster => Limiter::Shared(SharedBudget {
                conn: conn.clone(),
                key: rate_key(&business.key),
                interval_us: 1e6 / rate as f64,
                least,
            }),
        };
        Some((Arc::new(limiter), burst))
    }

    /// Takes up to `want` tokens (no more than the burst): in this
    /// process's bucket, waiting for the fewest worth a claim and taking as
    /// many more as are free; from the shared one, what it grants or how
    /// long to wait.
    pub async fn take(&self, want: usize, burst: usize) -> Result<Take, StoreError> {
        let want = want.clamp(1, burst);
        match self {
            Limiter::Process(bucket, least) => {
                let first = (*least).min(want);
                // Never more than the burst, so the bucket can grant it.
                let _ = bucket.until_n_ready(tokens(first)).await;
                let mut granted = first;
                while granted < want {
                    let n = (want - granted).min(*least);
                    if !matches!(bucket.check_n(tokens(n)), Ok(Ok(()))) {
                        break;
                    }
                    granted += n;
                }
                Ok(Take::Granted(granted))
            }
            Limiter::Shared(b) => {
                let mut conn = b.conn.clone();
                let (granted, wait_ms): (u64, u64) = scripts::RATE
                    .key(&b.key)
                    .arg(b.interval_us)
                    .arg(burst)
                    .arg("take")
                    .arg(want)
                    .arg(b.least.min(want))
                    .invoke_async(&mut conn)
                    .await?;
                Ok(if granted > 0 {
                    Take::Granted(granted as usize)
                } else {
                    Take::Wait(Duration::from_millis(wait_ms.max(1)))
                })
            }
        }
    }

    /// Gives back tokens a claim did not use. The process bucket keeps
    /// them spent, as it always has; the shared budget is credited.
    pub async fn give_back(&self, unused: usize, burst: usize) -> Result<(), StoreError> {
        let Limiter::Shared(b) = self else {
            return Ok(());
        };
        if unused == 0 {
            return Ok(());
        }
        let mut conn = b.conn.clone();
        let _: Vec<u64> = scripts::RATE
            .key(&b.key)
            .arg(b.interval_us)
            .arg(burst)
            .arg("give")
            .arg(unused)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }
}

/// `n` (at least 1) as the bucket counts tokens.
fn tokens(n: usize) -> NonZeroU32 {
    NonZeroU32::new(n.min(u32::MAX as usize) as u32).unwrap_or(NonZeroU32::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_key_shares_the_slot_of_an_unsharded_key() {
        assert_eq!(rate_key("delay:orders"), "{delay:orders}:rate");
        assert_eq!(rate_key("{orders}:due"), "{orders}:due:rate");
        assert_eq!(
            crate::keys::slot(&rate_key("delay:orders")),
            crate::keys::slot("{delay:orders}:inflight")
        );
    }
}
