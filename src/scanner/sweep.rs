//! The periodic sweep of per-member state nothing needs any more.

use super::*;

/// How often a key's stale retry state and orphaned claim records are
/// swept: once per lease, between 1 s and 30 s. A record is only swept once
/// it is older than a lease, so sweeping more often would find nothing new.
pub fn sweep_interval(lease: Duration) -> Duration {
    lease.clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Id mode: the longest a pass over a key's body hash takes, and so about
/// how long an orphaned body (a producer's bare `ZREM` cancel) can outlive
/// its id. Each sweep looks at the share of the hash that keeps a pass
/// within this, at least 2000 fields: the cost is spread evenly, whatever
/// the size, and never falls on a claim.
pub const BODY_PASS: Duration = Duration::from_secs(600);

/// Sweeps one key every [`sweep_interval`] until `stop`: cancelled members'
/// retry state, claim records whose settle write was lost and, in id mode
/// without tenants, orphaned bodies. An idle key costs one cheap script call per interval.
pub async fn sweep(lane: Arc<Lane>, stop: CancellationToken) {
    let every = sweep_interval(lane.business.lease);
    let (mut body_cursor, mut body_len) = ("0".to_string(), 0u64);
    let (mut meta_cursor, mut meta_len) = ("0".to_string(), 0u64);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Like the bodies, a pass over the retry state is spread over the
        // sweeps of BODY_PASS, at least 2000 entries per sweep.
        let share = (meta_len as u128 * every.as_millis() / BODY_PASS.as_millis()) as u64;
        let lease = lane.business.lease;
        match lane
            .store
            .sweep_slice(&meta_cursor, share.max(2000), lease)
            .await
        {
            Ok((next, out, len)) => {
                if out.meta + out.records > 0 {
                    tracing::debug!(
                        business = %lane.business.name,
                        key = %lane.store.keys().pending,
                        stale_meta = out.meta,
                        orphan_records = out.records,
                        "swept state nothing needs any more"
                    );
                }
                meta_cursor = next;
                meta_len = len;
            }
            Err(e) => tracing::debug!(error = %e, "sweep failed; trying again next interval"),
        }
        // With tenants an id may wait in any tenant's set, and a body could
        // only be called orphaned after reading every one of them: the body
        // pass would delete the bodies of waiting tasks, so it is left out
        // (a bare `ZREM` cancel there removes the body itself; docs/tenants.md).
        if lane.fair.is_some() {
            continue;
        }
        let share = (body_len as u128 * every.as_millis() / BODY_PASS.as_millis()) as u64;
        match lane.store.sweep_bodies(&body_cursor, share.max(2000)).await {
            Ok((next, deleted, len)) => {
                if deleted > 0 {
                    tracing::debug!(
                        business = %lane.business.name,
                        key = %lane.store.keys().pending,
                        orphan_bodies = deleted,
                        "swept bodies whose id was cancelled"
                    );
                }
                body_cursor = next;
                body_len = len;
            }
            Err(e) => tracing::debug!(error = %e, "body sweep failed; trying again next interval"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `n` publishes, one going out every `every`.
    async fn trickle(n: u64, every: Duration, progress: &AtomicU64) -> u64 {
        for _ in 0..n {
            tokio::time::sleep(every).await;
            progress.fetch_add(1, Ordering::Relaxed);
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_keeps_moving_is_never_declared_stalled() {
        let progress = AtomicU64::new(0);
        let stop = CancellationToken::new();
        let deadline = tokio::sync::OnceCell::new();
        // 90 s in all, far past PUBLISH_STALL, but a publish every 5 s.
        let batch = trickle(18, Duration::from_secs(5), &progress);
        let out = publish_or_give_up(batch, &progress, || false, &stop, &deadline).await;
        assert!(
            matches!(out, Published::All(18)),
            "a moving batch was given up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_stops_moving_is_declared_stalled_after_the_bound() {
        let progress = AtomicU64::new(0);
        let stop = CancellationToken::new();
        let deadline = tokio::sync::OnceCell::new();
        let start = tokio::time::Instant::now();
        let batch = async {
            trickle(3, Duration::from_secs(5), &progress).await;
            std::future::pending::<u64>().await
        };
        let out = publish_or_give_up(batch, &progress, || false, &stop, &deadline).await;
        assert!(matches!(out, Published::Stalled));
        // The last publish went out at 15 s; nothing moved for 30 s after.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(45) && waited <= Duration::from_secs(61),
            "{waited:?}"
        );
    }
}
