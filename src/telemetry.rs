//! Logs, Prometheus metrics, connection health and paused businesses; the
//! HTTP side that serves them is [`crate::http`].

pub mod intake;
pub mod tenants;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::config::{Business, LogFormat};

/// Sets up `tracing` once: human-readable or JSON lines on stderr.
///
/// lapin logs every connection error itself; delayd reports outages once per
/// outage, so lapin is quiet unless the filter names it.
pub fn init_logging(format: LogFormat, level: &str) {
    let mut filter = level.to_string();
    if !filter.contains("lapin") {
        filter.push_str(",lapin=off");
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lapin=off"));
    use std::io::IsTerminal;
    // Colour codes only help a terminal; in a file or a log shipper they are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Every metric delayd exports. Label `business` on all but the connection gauges.
pub struct Metrics {
    registry: Registry,
    /// Members claimed from Redis.
    pub claimed: IntCounterVec,
    /// Claims run (each one claim script call in Redis), empty ones too.
    pub claims: IntCounterVec,
    /// Members published (awaiting a confirm).
    pub published: IntCounterVec,
    /// Members the broker confirmed and delayd forgot.
    pub confirmed: IntCounterVec,
    /// Publishes the broker returned as unroutable.
    pub returned: IntCounterVec,
    /// Publishes the broker nacked.
    pub nacked: IntCounterVec,
    /// Members rescheduled with backoff, by reason.
    pub retried: IntCounterVec,
    /// Expired leases moved back to pending.
    pub recovered: IntCounterVec,
    /// Unconfirmed members handed back (shutdown, broken channel).
    pub released: IntCounterVec,
    /// Members moved to the dead set, by reason.
    pub dead_lettered: IntCounterVec,
    /// Id mode: ids dropped at claim because they were delivered within
    /// the `dedup_window`.
    pub deduplicated: IntCounterVec,
    /// Pending members (read on scrape).
    pub pending: IntGaugeVec,
    /// In-flight members (read on scrape).
    pub inflight: IntGaugeVec,
    /// Dead members (read on scrape).
    pub dead: IntGaugeVec,
    /// Age of the oldest overdue member (read on scrape).
    pub oldest_overdue: prometheus::GaugeVec,
    /// Pending members due within a window from now (read on scrape).
    pub pending_due_within: IntGaugeVec,
    /// Due time to broker confirm.
    pub lateness: HistogramVec,
    /// 1 while connected, per server.
    pub connection_up: IntGaugeVec,
    /// 1 while RabbitMQ blocks publishing.
    pub amqp_blocked: IntGauge,
    /// 1 while a business's publishing is paused (exchange missing or
    /// forbidden).
    pub paused: IntGaugeVec,
    /// 1 while an operator has paused the business (read on scrape).
    pub operator_paused: IntGaugeVec,
    /// What the intakes took in.
    pub intake: intake::Metrics,
    /// Per-tenant gauges of businesses with tenants (read on scrape).
    pub tenants: tenants::Metrics,
    /// Occurrences of recurring schedules skipped by their catch-up policy.
    pub recurring_missed: IntCounterVec,
}

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn float_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::GaugeVec {
    let g = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn flag(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

/// Lateness buckets, in seconds: milliseconds matter, minutes are an outage.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

impl Metrics {
    fn new() -> Self {
        let r = Registry::new();
        let b = &["business"];
        let br = &["business", "reason"];
        // Most metrics are per business.
        let count = |name: &str, help: &str| counter(&r, name, help, b);
        let level = |name: &str, help: &str| gauge(&r, name, help, b);
        Self {
            claimed: count("delayd_claimed_total", "Members claimed from Redis"),
            claims: count(
                "delayd_claims_total",
                "Claims run against Redis, empty ones included",
            ),
            published: count("delayd_published_total", "Members published to RabbitMQ"),
            confirmed: count("delayd_confirmed_total", "Members confirmed by RabbitMQ and removed"),
            returned: count("delayd_returned_total", "Publishes returned as unroutable"),
            nacked: count("delayd_nacked_total", "Publishes nacked by RabbitMQ"),
            retried: counter(
                &r,
                "delayd_retried_total",
                "Members rescheduled with backoff",
                br,
            ),
            recovered: count("delayd_recovered_total", "Expired leases moved back to pending"),
            released: count("delayd_released_total", "Unconfirmed members handed back to pending"),
            dead_lettered: counter(
                &r,
                "delayd_dead_lettered_total",
                "Members moved to the dead set",
                br,
            ),
            deduplicated: count("delayd_deduplicated_total", "Ids dropped at claim because they were delivered within dedup_window"),
            pending: level("delayd_pending", "Members pending in Redis"),
            inflight: level("delayd_inflight", "Members claimed and awaiting a confirm"),
            dead: level("delayd_dead", "Dead members"),
            oldest_overdue: float_gauge(
                &r,
                "delayd_oldest_overdue_seconds",
                "Age of the oldest due member still pending",
                b,
            ),
            pending_due_within: gauge(
                &r,
                "delayd_pending_due_within",
                "Pending members due within the window from now, overdue ones included",
                &["business", "window"],
            ),
            lateness: histogram(
                &r,
                "delayd_lateness_seconds",
                "Time from a member's due time to the broker's confirm",
                LATENESS_BUCKETS,
                b,
            ),
            connection_up: gauge(&r, "delayd_connection_up", "1 while connected", &["server"]),
            amqp_blocked: flag(
                &r,
                "delayd_amqp_blocked",
                "1 while RabbitMQ blocks publishing (memory or disk alarm)",
            ),
            paused: level("delayd_publish_paused", "1 while the business's exchange is missing or forbidden; members stay pending"),
            operator_paused: level("delayd_business_paused", "1 while an operator has paused the business (delayd pause, or the console): nothing is claimed, pending work stays"),
            intake: intake::Metrics::new(&r),
            tenants: tenants::Metrics::new(&r),
            recurring_missed: counter(
                &r,
                "delayd_recurring_missed_total",
                "Occurrences of a recurring schedule missed while no instance ran and skipped by its catch_up policy",
                &["business", "schedule"],
            ),
            registry: r,
        }
    }

    /// Puts every series of `business` that a count or a flag makes on
    /// `/metrics` at zero, before anything happens: a counter born at 1 hides
    /// its first event from `increase()`, so an alert would miss the first
    /// dead letter or unreplicated write, and a dashboard would show "no
    /// data" where 0 is the truth. Labels beyond `business` (reasons,
    /// schedules) are open-ended and appear with their first event.
    pub fn init_business(&self, business: &Business) {
        let b = &[business.name.as_str()];
        for c in [
            &self.claimed,
            &self.published,
            &self.confirmed,
            &self.returned,
            &self.nacked,
            &self.recovered,
            &self.released,
            &self.deduplicated,
        ] {
            c.with_label_values(b);
        }
        self.lateness.with_label_values(b);
        self.paused.with_label_values(b).set(0);
        if business.intake.is_some() {
            self.intake.init_business(&business.name);
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_where(|_| true)
    }

    /// Like [`Metrics::render`], without the series whose `business`
    /// label `shown` refuses: a scrape shows only the businesses its
    /// caller may see.
    pub fn render_where(&self, shown: impl Fn(&str) -> bool) -> String {
        let mut families = self.registry.gather();
        for f in &mut families {
            let kept: Vec<_> = f
                .take_metric()
                .into_iter()
                .filter(|m| {
                    m.get_label()
                        .iter()
                        .all(|l| l.name() != "business" || shown(l.value()))
                })
                .collect();
            f.set_metric(kept);
        }
        families.retain(|f| !f.get_metric().is_empty());
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Whether a server is reachable, logging only the transitions so an outage
/// is one warning and one recovery line, however many tasks notice it.
pub struct Health {
    server: &'static str,
    up: AtomicBool,
    since: std::sync::Mutex<Option<Instant>>,
    /// The latest failure, for `/readyz`.
    reason: std::sync::Mutex<String>,
}

impl Health {
    /// A tracker for `server` ("redis" or "amqp"), initially down.
    pub fn new(server: &'static str) -> Arc<Self> {
        METRICS.connection_up.with_label_values(&[server]).set(0);
        Arc::new(Self {
            server,
            up: AtomicBool::new(false),
            since: std::sync::Mutex::new(None),
            reason: std::sync::Mutex::new("not connected yet".into()),
        })
    }

    /// Is the server believed reachable?
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Records a success; logs the end of an outage.
    pub fn up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            METRICS
                .connection_up
                .with_label_values(&[self.server])
                .set(1);
            let since = self.since.lock().map(|mut s| s.take()).unwrap_or(None);
            match since {
                Some(t) => tracing::info!(
                    server = self.server,
                    down_for = %humantime::format_duration(Duration::from_millis(t.elapsed().as_millis() as u64)),
                    "connection restored"
                ),
                None => tracing::info!(server = self.server, "connected"),
            }
        }
    }

    /// Why the server is down, as last reported.
    pub fn reason(&self) -> String {
        match self.reason.lock() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Records a failure; logs the start of an outage once.
    pub fn down(&self, error: &dyn std::fmt::Display) {
        if let Ok(mut r) = self.reason.lock() {
            *r = error.to_string();
        }
        let was_up = self.up.swap(false, Ordering::Relaxed);
        let mut since = match self.since.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        if was_up || since.is_none() {
            METRICS
                .connection_up
                .with_label_values(&[self.server])
                .set(0);
            *since = Some(Instant::now());
            tracing::warn!(
                server = self.server,
                error = %error,
                "connection lost or refused; retrying with backoff until it is back"
            );
        }
    }
}

/// Capped exponential backoff with full jitter, so many scanners retrying
/// against a recovering server do not arrive together.
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// Starts at `base`, doubling up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The next delay to sleep.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let ms = exp.as_millis() as u64;
        Duration::from_millis(ms / 2 + rand::random_range(0..=ms / 2 + 1))
    }

    /// Back to the first delay after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Businesses whose publishing is paused, and why, for `/readyz` and the console.
static PAUSED: LazyLock<std::sync::Mutex<std::collections::BTreeMap<String, String>>> =
    LazyLock::new(Default::default);

/// Records that `business` cannot publish (`Some(reason)`) or can again.
pub fn set_paused(business: &str, reason: Option<&str>) {
    let mut p = PAUSED.lock().unwrap_or_else(|e| e.into_inner());
    match reason {
        Some(r) => p.insert(business.to_string(), r.to_string()),
        None => p.remove(business),
    };
}

/// Every business whose publishing is paused, with the reason.
pub fn paused() -> std::collections::BTreeMap<String, String> {
    PAUSED.lock().map(|p| p.clone()).unwrap_or_default()
}
