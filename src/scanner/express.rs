//! The express scanner of a business with tenants (docs/tenants.md).
//!
//! While the other scanners work through a backlog, a light tenant's member
//! that falls due waits for their next claim: one claim and one publish of
//! a full batch away, 20 to 30 ms on a loaded host. The express scanner
//! claims nothing of the tenants the last claim saw with due work; it
//! watches the tenants' index for a tenant newly due and claims its first
//! member at once, as fair queueing serves a tenant back from idle. While
//! no tenant has due work it costs nothing: the lead scanner answers then.

use super::*;

impl Scanner<'_> {
    /// Waits until a tenant that no claim has seen with due work is due,
    /// while the lane has a backlog; sets how many such tenants are due.
    /// A write to the index wakes it for a look (at most one per
    /// [`WAKE_GAP`]; without keyspace notifications it polls), and a look
    /// that finds the next such tenant due later sleeps until then.
    pub(super) async fn wait_fresh(&mut self) -> Result<(), Next> {
        let lane = self.lane;
        let Some(fair) = &lane.fair else {
            return Err(Next::Stop);
        };
        let mut until: Option<tokio::time::Instant> = None;
        let mut last_look: Option<tokio::time::Instant> = None;
        loop {
            if !std::mem::take(&mut self.look_now) {
                tokio::select! {
                    _ = self.stop.cancelled() => return Err(Next::Stop),
                    _ = lane.express_wake.notified() => {}
                    _ = sleep_until_opt(until) => {}
                    // Without keyspace notifications, a poll.
                    _ = tokio::time::sleep(lane.max_idle()) => {}
                }
                if let Some(at) = last_look.filter(|at| at.elapsed() < WAKE_GAP) {
                    tokio::select! {
                        _ = self.stop.cancelled() => return Err(Next::Stop),
                        _ = tokio::time::sleep_until(at + WAKE_GAP) => {}
                    }
                }
            }
            if !fair.busy() {
                until = None;
                continue;
            }
            last_look = Some(tokio::time::Instant::now());
            let head = lane
                .store
                .tenants_head(&fair.passed_over(), lane.business.batch_size)
                .await;
            let looked = tokio::time::Instant::now();
            // Redis unreachable: the other scanners report it and retry.
            let Ok(head) = head else {
                return Err(Next::RetryAfter(lane.business.poll_interval));
            };
            until = head.head_ms.map(|at| {
                looked + Duration::from_millis(at.saturating_sub(head.now_ms).max(0) as u64)
            });
            if head.due > 0 {
                self.fresh = head.due;
                return Ok(());
            }
        }
    }
}
