//! The daemon: connects to both servers, starts every scanner, restarts any
//! that fails, and turns SIGTERM/SIGINT into a clean, bounded stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::ConnectionManager;
use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;

use crate::amqp::Broker;
use crate::config::Config;
use crate::scanner::{self, Lane};
use crate::store::{KeyFamily, Store};
use crate::telemetry::{self, Backoff, Health, HttpState};

/// Errors that stop the daemon before it starts dispatching.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The Redis URL is unusable.
    #[error("[redis] url {0}: {1}")]
    RedisUrl(String, String),
    /// The AMQP URL is unusable.
    #[error(transparent)]
    Amqp(#[from] crate::amqp::AmqpError),
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The HTTP listener could not bind.
    #[error("[http] listen {0}: {1}; choose a free address or set listen = \"off\"")]
    Http(std::net::SocketAddr, std::io::Error),
}

/// Opens a Redis client, mapping a bad URL to a user-facing error.
pub fn redis_client(config: &Config) -> Result<redis::Client, RunError> {
    redis::Client::open(config.redis_url.expose()).map_err(|e| {
        RunError::RedisUrl(
            config.redis_url.redacted(),
            crate::config::redact_url(&e.to_string()),
        )
    })
}

/// Connects a self-reconnecting Redis connection, retrying with backoff
/// until it succeeds or `stop` fires, so delayd can start before Redis.
pub async fn connect_redis(
    client: &redis::Client,
    health: &Health,
    stop: &CancellationToken,
) -> Option<ConnectionManager> {
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2));
    // Capped at 5 s, so dispatching starts within seconds of Redis coming up.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let attempt = tokio::select! {
            _ = stop.cancelled() => return None,
            r = client.get_connection_manager_with_config(cfg.clone()) => r,
        };
        match attempt {
            Ok(c) => {
                health.up();
                return Some(c);
            }
            Err(e) => {
                health.down(&e);
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT, then stops cleanly.
pub async fn run(config: Config) -> Result<(), RunError> {
    let client = redis_client(&config)?;
    let stop = CancellationToken::new();
    let conn_stop = CancellationToken::new();
    let broker = Broker::start(&config.amqp, conn_stop.clone())?;
    let redis_health = Health::new("redis");
    let deadlines: Vec<Arc<OnceCell<tokio::time::Instant>>> = config
        .businesses
        .iter()
        .map(|_| Arc::new(OnceCell::new()))
        .collect();
    let signals = signal_hook_tokio::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(RunError::Signals)?;
    let signal_task = tokio::spawn(watch_signals(
        signals,
        stop.clone(),
        config
            .businesses
            .iter()
            .map(|b| b.shutdown_timeout)
            .zip(deadlines.iter().cloned())
            .collect(),
    ));

    tracing::info!(
        redis = %config.redis_url,
        amqp = %config.amqp,
        businesses = config.businesses.len(),
        "delayd starting"
    );
    let Some(conn) = connect_redis(&client, &redis_health, &stop).await else {
        conn_stop.cancel();
        return Ok(());
    };

    let mut lanes = Vec::new();
    for b in &config.businesses {
        let business = Arc::new(b.clone());
        // Bursts no larger than a batch keep the pace even within a second.
        let limiter = b.max_rate.and_then(|r| {
            let burst = (r as usize).min(b.batch_size).max(1);
            let quota = governor::Quota::per_second(std::num::NonZeroU32::new(r)?)
                .allow_burst(std::num::NonZeroU32::new(burst as u32)?);
            Some((Arc::new(governor::RateLimiter::direct(quota)), burst))
        });
        for key in b.keys() {
            lanes.push(Arc::new(Lane {
                business: business.clone(),
                store: Store::new(conn.clone(), KeyFamily::new(&key), b.score_unit)
                    .with_member(b.member),
                lead_wake: Notify::new(),
                all_wake: Notify::new(),
                notifications: AtomicBool::new(false),
                limiter: limiter.clone(),
                redis: redis_health.clone(),
                lead_claims: std::sync::atomic::AtomicU64::new(0),
                pause: Default::default(),
            }));
        }
    }

    if let Some(listen) = config.http_listen {
        let state = Arc::new(HttpState {
            redis: redis_health.clone(),
            amqp: broker.health.clone(),
            stores: lanes
                .iter()
                .map(|l| (l.business.name.clone(), l.store.clone()))
                .collect(),
            scrape: tokio::sync::Mutex::new(()),
        });
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| RunError::Http(listen, e))?;
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve_http(listener, state).await {
                tracing::error!(%listen, error = %e, "HTTP server stopped");
            }
        });
    }

    let db = client.get_connection_info().redis_settings().db();
    tokio::spawn(watch_keyspace(
        client.clone(),
        conn.clone(),
        db,
        lanes.clone(),
        stop.clone(),
    ));

    for lane in &lanes {
        tokio::spawn(scanner::sweep(lane.clone(), stop.clone()));
    }
    let mut tasks = Vec::new();
    for lane in &lanes {
        let bi = config
            .businesses
            .iter()
            .position(|b| b.name == lane.business.name)
            .unwrap_or(0);
        for index in 0..lane.business.scanners {
            tasks.push(tokio::spawn(supervise_scanner(
                lane.clone(),
                index,
                broker.clone(),
                stop.clone(),
                deadlines[bi].clone(),
            )));
        }
    }
    tracing::info!(
        lanes = lanes.len(),
        scanners = tasks.len(),
        "dispatching; SIGTERM or SIGINT stops cleanly"
    );
    for t in tasks {
        let _ = t.await;
    }
    conn_stop.cancel();
    signal_task.abort();
    // Give the broker connection a moment to close politely.
    tokio::time::sleep(Duration::from_millis(50)).await;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Restarts a scanner that panicked, with backoff; a clean return means stop.
async fn supervise_scanner(
    lane: Arc<Lane>,
    index: usize,
    broker: Broker,
    stop: CancellationToken,
    deadline: Arc<OnceCell<tokio::time::Instant>>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let task = tokio::spawn(scanner::run(
            lane.clone(),
            index,
            broker.clone(),
            stop.clone(),
            deadline.clone(),
        ));
        match task.await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(
                    business = %lane.business.name,
                    key = %lane.store.keys().pending,
                    index,
                    error = %e,
                    "scanner failed; restarting it (its claims are recovered when their lease expires)"
                );
                if stop.is_cancelled() {
                    return;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// First signal: stop claiming and start each business's drain deadline.
/// Second signal: drain deadlines end now, so unconfirmed members are handed
/// back at once and the process exits.
async fn watch_signals(
    mut signals: signal_hook_tokio::Signals,
    stop: CancellationToken,
    deadlines: Vec<(Duration, Arc<OnceCell<tokio::time::Instant>>)>,
) {
    // There is nothing to reload: SIGHUP must not end the process like a crash.
    let mut next = async || loop {
        match signals.next().await {
            Some(signal_hook::consts::SIGHUP) => {
                tracing::info!("SIGHUP ignored: delayd does not reload its configuration; restart it to apply changes");
            }
            other => return other,
        }
    };
    if let Some(sig) = next().await {
        tracing::info!(
            signal = sig,
            "stopping: no new claims; waiting for owed confirms (bounded by shutdown_timeout)"
        );
        let now = tokio::time::Instant::now();
        for (timeout, cell) in &deadlines {
            let _ = cell.set(now + *timeout);
        }
        stop.cancel();
    }
    if next().await.is_some() {
        tracing::warn!(
            "second signal: exiting now; members still awaiting a confirm go back to pending when their lease expires"
        );
        std::process::exit(0);
    }
}

/// Subscribes to keyspace events of every key, as wake-up hints only: if the
/// server does not publish them, or the subscription drops, scanners fall
/// back to polling every `poll_interval`.
async fn watch_keyspace(
    client: redis::Client,
    mut conn: ConnectionManager,
    db: i64,
    lanes: Vec<Arc<Lane>>,
    stop: CancellationToken,
) {
    let set_all = |on: bool| {
        for l in &lanes {
            l.notifications.store(on, Ordering::Relaxed);
        }
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut reported: Option<bool> = None;
    loop {
        let flags = crate::store::keyspace_flags(&mut conn).await;
        // Managed services often forbid CONFIG; subscribing anyway costs
        // nothing and works when the operator enabled the events.
        let enabled = flags
            .as_deref()
            .map(crate::store::flags_notify_zsets)
            .unwrap_or(true);
        if reported != Some(enabled) {
            if enabled {
                tracing::info!(flags = flags.as_deref().unwrap_or("unknown"), "keyspace notifications on: idle scanners wake on ZADD and sleep until the next due time");
            } else {
                tracing::info!(flags = flags.as_deref().unwrap_or(""), "keyspace notifications off: idle scanners poll every poll_interval; for millisecond lateness run CONFIG SET notify-keyspace-events Kz");
            }
            reported = Some(enabled);
        }
        if !enabled {
            set_all(false);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(60)) => continue,
            }
        }
        let mut pubsub = match client.get_async_pubsub().await {
            Ok(p) => p,
            Err(e) => {
                set_all(false);
                tracing::debug!(error = %e, "keyspace subscription failed; polling meanwhile");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                }
            }
        };
        let mut channels = std::collections::HashMap::new();
        let mut ok = true;
        for l in &lanes {
            let ch = format!("__keyspace@{db}__:{}", l.store.keys().pending);
            if pubsub.subscribe(&ch).await.is_err() {
                ok = false;
                break;
            }
            channels.insert(ch.into_bytes(), l.clone());
        }
        if !ok {
            set_all(false);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => continue,
            }
        }
        backoff.reset();
        set_all(true);
        // Anything added while we were not subscribed is found by a poll.
        for l in &lanes {
            l.lead_wake.notify_one();
        }
        let mut stream = pubsub.into_on_message();
        let recheck = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = &mut recheck => break,
                msg = stream.next() => match msg {
                    Some(msg) => {
                        let payload: &[u8] = msg.get_payload_bytes();
                        // Events that can make a member due sooner; delayd's
                        // own claims raise zrem, which must not wake it.
                        if matches!(
                            payload,
                            b"zadd" | b"zincr" | b"zunionstore" | b"zinterstore"
                                | b"zdiffstore" | b"zrangestore" | b"rename_to"
                                | b"restore" | b"copy_to"
                        ) {
                            if let Some(l) = channels.get(msg.get_channel_name().as_bytes()) {
                                l.lead_wake.notify_one();
                            }
                        }
                    }
                    None => {
                        set_all(false);
                        tracing::debug!("keyspace subscription dropped; polling until it is back");
                        break;
                    }
                }
            }
        }
    }
}
