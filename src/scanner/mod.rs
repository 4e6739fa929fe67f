//! One scanner: claim due members, publish them, and (in its settler task)
//! settle each one by the broker's answer.
//!
//! The scanner is only ever cancelled at safe points: before a claim and
//! while it sleeps. Once a claim has run, every member it returned is handed
//! to the settler, which answers for it: acked, retried, dead-lettered or
//! released back to pending. Nothing claimed is forgotten.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::{Channel, Confirmation};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::amqp::{self, Broker};
use crate::config::Business;
use crate::message;
use crate::rate::{Limiter, Take};
use crate::store::{Back, BackPolicy, Claimed, Held, Store};
use crate::telemetry::{Backoff, Health, METRICS};

mod batch;
mod claim;
mod express;
mod outcome;
mod settle;
mod sweep;

use batch::*;
use claim::*;
use outcome::*;
use settle::*;
pub use sweep::{sweep, sweep_interval, BODY_PASS};

/// Adds `n` to `counter` under `labels` (the business's name first).
fn add_to(counter: &prometheus::IntCounterVec, labels: &[&str], n: u64) {
    counter.with_label_values(labels).inc_by(n);
}

/// Counts `n` members of `b` moved to the dead set for `reason`.
fn count_dead(b: &Business, reason: &str, n: u64) {
    add_to(&METRICS.dead_lettered, &[&b.name, reason], n);
}

/// One Redis key of a business and what its scanners share.
pub struct Lane {
    /// The business this key belongs to.
    pub business: Arc<Business>,
    /// Script calls for this key's family.
    pub store: Store,
    /// Wakes the lead scanner early: a keyspace notification, or a scanner
    /// that saw more work than it could take. Stores a permit, so a wake-up
    /// that arrives while the leader is busy is not lost.
    pub lead_wake: Notify,
    /// Wakes the other scanners when the leader found a full batch.
    pub all_wake: Notify,
    /// Wakes the express scanner of a business with tenants: a write to
    /// the tenants' index, which may make a tenant newly due.
    pub express_wake: Notify,
    /// True while keyspace notifications for this key are being received.
    pub notifications: AtomicBool,
    /// The business's publish-rate cap and the most one claim may take
    /// from it, when `max_rate` is set.
    pub limiter: Option<(Arc<Limiter>, usize)>,
    /// Redis reachability, shared by the process.
    pub redis: Arc<Health>,
    /// Claims the leader has made: the others check that it still moves.
    pub lead_claims: AtomicU64,
    /// Set while the exchange is missing or forbidden.
    pub pause: Pause,
    /// A business with tenants: claims share the due members fairly among
    /// them. `None` claims exactly as a business without tenants always has.
    pub fair: Option<crate::tenants::Fair>,
}

impl Lane {
    fn max_idle(&self) -> Duration {
        if self.notifications.load(Ordering::Relaxed) {
            self.business.watchdog_interval
        } else {
            self.business.poll_interval
        }
    }
}

/// The claim a member came from, shared by its members in the settler.
struct ClaimInfo {
    /// Settle writes name it; they act only on members the claim still holds.
    tag: u16,
    /// The record of first attempts' due times, if the claim wrote one.
    record: Option<Arc<str>>,
    /// Redis's clock at claim time, plus `at.elapsed()`, gives a wall time
    /// on Redis's clock without asking it again.
    now_ms: i64,
    at: Instant,
}

/// A member from its claim until it is settled.
struct Holding {
    claimed: Arc<Claimed>,
    claim: Arc<ClaimInfo>,
    /// Published, its confirm still owed: the id of the channel it went on.
    published: Option<u16>,
    /// A return that carried this member's body: whatever its confirm says,
    /// the broker did not route it.
    returned: Option<String>,
    /// Its place in its tenant's `tenant_window`, given up when its outcome
    /// is known (the holding drops).
    _slot: Option<crate::tenants::Slot>,
}

/// Handed from the scanner to its settler.
enum ToSettle {
    /// Claimed, not yet published: sent before the first publish, so the
    /// settler extends the leases of members stuck in a blocked publish
    /// and hands them back at the stop deadline.
    /// With each member's slot in its tenant's `tenant_window`, if counted.
    Claimed(
        Arc<ClaimInfo>,
        Vec<(u64, Arc<Claimed>)>,
        Vec<Option<crate::tenants::Slot>>,
    ),
    /// Published on this channel; the confirms are owed.
    Published(Vec<(u64, lapin::PublisherConfirm)>, Channel),
    /// Claimed but never published (the channel broke mid-batch, the
    /// publish stalled, or the stop deadline passed).
    Unpublished(Vec<u64>),
}

/// Runs scanner `index` of `lane` until `stop` is cancelled, then waits for
/// its settler, which finishes by `drain_deadline` at the latest.
pub async fn run(
    lane: Arc<Lane>,
    index: usize,
    broker: Broker,
    stop: CancellationToken,
    drain_deadline: Arc<tokio::sync::OnceCell<tokio::time::Instant>>,
) {
    let span = tracing::info_span!("scanner", business = %lane.business.name, key = %lane.store.keys().pending, index);
    async move {
        let window = Arc::new(Semaphore::new(lane.business.window));
        let (tx, rx) = mpsc::unbounded_channel();
        let settler = tokio::spawn(
            settle(lane.clone(), rx, window.clone(), drain_deadline.clone()).in_current_span(),
        );
        // The channel outlives the settler: dropping it closes it, and a
        // closed channel fails the confirms still owed, which would hand
        // back members the broker already has.
        let channel = Scanner::new(&lane, index, &broker, &stop, &window, &tx, &drain_deadline)
            .run()
            .await;
        drop(tx);
        if let Err(e) = settler.await {
            tracing::error!(error = %e, "settler task failed; its leases will be recovered");
        }
        drop(channel);
    }
    .instrument(span)
    .await
}

/// Publishing paused for a business because its exchange is missing or
/// forbidden; reported once on the log, a metric and `/readyz`.
#[derive(Default)]
pub struct Pause(std::sync::Mutex<Option<String>>);

impl Pause {
    /// True while publishing is paused.
    pub fn is_paused(&self) -> bool {
        self.0.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    fn pause(&self, business: &str, reason: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            tracing::error!(%reason, "the broker refused the exchange (missing or forbidden); members stay pending and publishing resumes once it is back");
            METRICS.paused.with_label_values(&[business]).set(1);
            crate::telemetry::set_paused(business, Some(reason));
        }
        *g = Some(reason.to_string());
    }

    fn resume(&self, business: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.take().is_some() {
            tracing::info!("the exchange answers again; publishing resumes");
            METRICS.paused.with_label_values(&[business]).set(0);
            crate::telemetry::set_paused(business, None);
        }
    }
}
