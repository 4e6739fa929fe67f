//! The HTTP side: `/metrics`, `/healthz` and `/readyz` for probes, the
//! console page at `/`, and the JSON API under `/api/v1` that the page,
//! scripts and producers without Redis use.
//!
//! - `probes`: metrics and health, as before the console;
//! - `api`: one handler per action, calling the same functions as the CLI
//!   ([`crate::tasks`], [`crate::store`]);
//! - `auth`: reads need the read token when one is set, writes the admin
//!   token (read-only without one);
//! - `guard`: the host names the console answers to, and where writes
//!   may come from;
//! - `rates`: per-second rates and lateness quantiles over the last minute,
//!   from this process's metrics (no Redis call);
//! - `page`: the console, one static page and its script, built in.

use std::sync::{Arc, OnceLock};

use axum::routing::get;
use tokio::sync::Mutex;

use crate::config::{Business, Config};
use crate::redis_conn::RedisConn;
use crate::secret::Secret;
use crate::store::Store;
use crate::telemetry::Health;

mod api;
mod auth;
mod error;
mod guard;
mod page;
mod probes;
mod rates;

/// What the HTTP handlers need.
pub struct HttpState {
    /// Redis reachability.
    pub redis: Arc<Health>,
    /// RabbitMQ reachability.
    pub amqp: Arc<Health>,
    /// One store per key, with its business name, for scrape-time gauges
    /// and the overview; set once Redis is reached.
    stores: OnceLock<Vec<(String, Store)>>,
    /// The shared Redis connection, set once Redis is reached.
    conn: OnceLock<RedisConn>,
    /// Every business, as configured.
    businesses: Vec<Business>,
    /// The token API writes need; `None`: read-only.
    admin_token: Option<Secret>,
    /// The token API reads need (besides the admin token); `None`: open.
    read_token: Option<Secret>,
    /// The host names the console and the API answer to.
    hosts: guard::Hosts,
    /// Serialises scrapes so a burst of them costs Redis one round each.
    scrape: Mutex<()>,
    /// Answers the overview reuses for a second, so any number of open
    /// pages cost Redis what one does.
    overview: api::Cache,
    /// Counter samples behind the rates.
    rates: rates::Sampler,
}

impl HttpState {
    /// The state for `config`, before Redis is reached.
    pub fn new(redis: Arc<Health>, amqp: Arc<Health>, config: &Config) -> Arc<Self> {
        Arc::new(Self {
            redis,
            amqp,
            stores: OnceLock::new(),
            conn: OnceLock::new(),
            businesses: config.businesses.clone(),
            admin_token: config.http_admin_token.clone(),
            read_token: config.http_read_token.clone(),
            hosts: guard::Hosts::new(config.http_listen, &config.http_allowed_hosts),
            scrape: Mutex::new(()),
            overview: Default::default(),
            rates: Default::default(),
        })
    }

    /// Redis is reached: `stores` are every key's store with its business.
    pub fn connected(&self, conn: RedisConn, stores: Vec<(String, Store)>) {
        let _ = self.conn.set(conn);
        let _ = self.stores.set(stores);
    }

    fn stores(&self) -> &[(String, Store)] {
        self.stores.get().map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// The businesses `role` may see; `open`: whether the route answers
    /// callers without a token (see [`auth::Role::sees`]).
    fn seen_by(&self, role: &auth::Role, open: bool) -> Vec<&Business> {
        self.businesses
            .iter()
            .filter(|b| role.sees(b, open))
            .collect()
    }
}

/// Serves the probes, the console and the API until the process exits.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
) -> std::io::Result<()> {
    tokio::spawn(rates::sample_every(
        std::time::Duration::from_secs(5),
        Arc::downgrade(&state),
    ));
    // Probes and scrapers address a pod by whatever name or address they
    // know it by, and carry no task data: only the console is guarded.
    let console = axum::Router::new()
        .merge(page::routes())
        .nest(
            "/api/v1",
            api::routes().layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::reads,
            )),
        )
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ));
    let app = axum::Router::new()
        .route("/metrics", get(probes::metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(probes::ready))
        .merge(console)
        .with_state(state);
    if let Ok(listen) = listener.local_addr() {
        tracing::info!(%listen, "serving the console at /, the API under /api/v1, /metrics, /healthz and /readyz");
    }
    axum::serve(listener, app).await
}
