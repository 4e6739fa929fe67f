//! The daemon: connects to both servers, starts every scanner, restarts any
//! that fails, and turns SIGTERM/SIGINT into a clean, bounded stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, OnceCell};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::amqp::{Broker, Role};
use crate::config::{Business, Config, RedisMode};
use crate::http::HttpState;
use crate::rate::Limiter;
use crate::redis_conn::{Redis, RedisConn};
use crate::scanner::{self, Lane};
use crate::store::Store;
use crate::telemetry::{Backoff, Health};

/// Errors that stop the daemon before it starts dispatching.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The Redis settings are unusable.
    #[error(transparent)]
    Redis(#[from] crate::redis_conn::ConnError),
    /// The AMQP URL is unusable.
    #[error(transparent)]
    Amqp(#[from] crate::amqp::AmqpError),
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// Members wait under key names a business does not read.
    #[error("{0}")]
    UnreadKeys(String),
    /// An intake asks Redis for a wait it cannot do.
    #[error("business \"{0}\": {1}")]
    IntakeRedis(String, String),
    /// An intake exchange exists with a type delayd cannot consume through.
    #[error("business \"{0}\": {1}")]
    IntakeExchange(String, String),
    /// The HTTP listener could not bind.
    #[error("[http] listen {0}: {1}; choose a free address or set listen = \"off\"")]
    Http(std::net::SocketAddr, std::io::Error),
}

/// Refuses to start on an intake that asks for `WAITAOF` where Redis lacks
/// it, with the line `delayd check` prints. A question that fails (Redis
/// going away at this moment) is logged and does not hold up the start.
async fn refuse_missing_waitaof(config: &Config, conn: &RedisConn) -> Result<(), RunError> {
    for b in &config.businesses {
        match crate::intake::waitaof::refusal(conn, b).await {
            Ok(None) => {}
            Ok(Some(line)) => return Err(RunError::IntakeRedis(b.name.clone(), line)),
            Err(e) => {
                tracing::warn!(business = %b.name, error = %e, "could not ask Redis whether it has WAITAOF");
            }
        }
    }
    Ok(())
}

/// Refuses to start while members wait under key names a business does not
/// read, unless it says `ignore_unread_keys`; then it warns. A lookup that
/// fails (Redis going away at this moment) is logged and does not hold up
/// the start: the names are checked again at the next one.
async fn refuse_unread_keys(config: &Config, conn: &RedisConn) -> Result<(), RunError> {
    for b in &config.businesses {
        match crate::unread::find(conn, b).await {
            Ok(found) if found.is_empty() => {}
            Ok(found) if b.ignore_unread_keys => {
                tracing::warn!(business = %b.name, "{}", crate::unread::describe(b, &found));
            }
            Ok(found) => return Err(RunError::UnreadKeys(crate::unread::describe(b, &found))),
            Err(e) => {
                tracing::warn!(business = %b.name, error = %e, "could not look for members under key names this business does not read");
            }
        }
    }
    Ok(())
}

/// How long `run` waits for the broker to look at the intake exchanges
/// before it starts anyway (each intake checks again before consuming).
const INTAKE_CHECK_WAIT: Duration = Duration::from_secs(10);

/// Refuses to start on an intake exchange that exists with another type
/// than fanout, with the line `delayd check` prints. A broker that is not
/// reachable yet does not hold up the start: each intake makes the same
/// check before it consumes, and waits while it fails.
async fn refuse_wrong_intake_exchanges(
    config: &Config,
    consuming: &Broker,
    stop: &CancellationToken,
) -> Result<(), RunError> {
    let Ok(Some(conn)) = tokio::time::timeout(INTAKE_CHECK_WAIT, consuming.ready(stop)).await
    else {
        return Ok(());
    };
    for b in &config.businesses {
        let Some(intake) = &b.intake else { continue };
        match crate::intake::topology::refusal(&conn, intake).await {
            Ok(None) => {}
            Ok(Some(line)) => return Err(RunError::IntakeExchange(b.name.clone(), line)),
            Err(e) => {
                tracing::warn!(business = %b.name, error = %e, "could not look at the intake exchange; the intake checks it again before consuming");
            }
        }
    }
    Ok(())
}

/// Connects to Redis in the configured mode, retrying with backoff until
/// it succeeds or `stop` fires, so delayd can start before Redis. Each
/// failure's reason is what `/readyz` shows.
pub async fn connect_redis(
    redis: &Redis,
    health: &Health,
    stop: &CancellationToken,
) -> Option<RedisConn> {
    // Capped at 5 s, so dispatching starts within seconds of Redis coming up.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let attempt = tokio::select! {
            _ = stop.cancelled() => return None,
            r = redis.connect() => r,
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
    for b in &config.businesses {
        crate::telemetry::METRICS.init_business(b);
    }
    let redis = Redis::new(&config.redis)?;
    let stop = CancellationToken::new();
    let conn_stop = CancellationToken::new();
    let broker = Broker::start(&config.amqp, Role::Publish, conn_stop.clone())?;
    // The intakes' own connection (see `Role::Consume`), where one is configured.
    let consuming = config
        .businesses
        .iter()
        .any(|b| b.intake.is_some())
        .then(|| Broker::start(&config.amqp, Role::Consume, conn_stop.clone()))
        .transpose()?;
    let redis_health = Health::new("redis");
    let deadlines: Vec<Deadline> = config
        .businesses
        .iter()
        .map(|_| Arc::new(OnceCell::new()))
        .collect();
    let signal_task = spawn_signal_watch(&config, &stop, &deadlines)?;
    tracing::info!(
        redis = %config.redis.describe(),
        amqp = %config.amqp,
        businesses = config.businesses.len(),
        "delayd starting"
    );
    // Served before Redis is reached, so /readyz can say why it is not.
    let http = serve_http(&config, &redis_health, &broker).await?;
    let Some(conn) = connect_redis(&redis, &redis_health, &stop).await else {
        conn_stop.cancel();
        return Ok(());
    };
    let preflight = async {
        refuse_missing_waitaof(&config, &conn).await?;
        refuse_unread_keys(&config, &conn).await?;
        match &consuming {
            Some(c) => refuse_wrong_intake_exchanges(&config, c, &stop).await,
            None => Ok(()),
        }
    };
    if let Err(e) = preflight.await {
        stop.cancel();
        conn_stop.cancel();
        signal_task.abort();
        return Err(e);
    }
    let lanes = lanes(&config, &conn, &redis_health);
    if let Some(http) = &http {
        http.connected(
            conn.clone(),
            lanes
                .iter()
                .map(|l| (l.business.name.clone(), l.store.clone()))
                .collect(),
        );
    }
    tokio::spawn(watch_keyspace(
        redis.clone(),
        conn.clone(),
        lanes.clone(),
        stop.clone(),
    ));
    for lane in &lanes {
        tokio::spawn(scanner::sweep(lane.clone(), stop.clone()));
    }
    let businesses = distinct_businesses(&lanes);
    // Intakes start once their businesses' scanners can deliver.
    let intakes = start_intakes(
        &config,
        &businesses,
        &conn,
        &redis,
        consuming.as_ref(),
        &redis_health,
        &stop,
    );
    let writers = crate::recurring::writer::start(&businesses, &conn, &stop);
    let scanners = spawn_scanners(&config, &lanes, &broker, &stop, &deadlines);
    tracing::info!(
        lanes = lanes.len(),
        scanners = scanners.len(),
        "dispatching; SIGTERM or SIGINT stops cleanly"
    );
    for t in scanners.into_iter().chain(intakes).chain(writers) {
        let _ = t.await;
    }
    conn_stop.cancel();
    signal_task.abort();
    // Give the broker connections a moment to close politely.
    tokio::time::sleep(Duration::from_millis(50)).await;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Starts the intake of every business that has one, on the consuming
/// connection (there is none when no business has an intake).
fn start_intakes(
    config: &Config,
    businesses: &[Arc<Business>],
    conn: &RedisConn,
    redis: &Redis,
    consuming: Option<&Broker>,
    redis_health: &Arc<Health>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let Some(consuming) = consuming else {
        return Vec::new();
    };
    let with_intake: Vec<_> = businesses
        .iter()
        .filter(|b| b.intake.is_some())
        .cloned()
        .collect();
    let own_user = crate::amqp::login_user(&config.amqp).map(Arc::from);
    crate::intake::start(
        &with_intake,
        conn,
        redis,
        consuming,
        redis_health,
        own_user,
        stop,
    )
}

/// When a business's stop must end: set by the first signal, read by its
/// scanners.
type Deadline = Arc<OnceCell<tokio::time::Instant>>;

/// Watches SIGTERM, SIGINT and SIGHUP (see `watch_signals`).
fn spawn_signal_watch(
    config: &Config,
    stop: &CancellationToken,
    deadlines: &[Deadline],
) -> Result<JoinHandle<()>, RunError> {
    let signals = signal_hook_tokio::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(RunError::Signals)?;
    Ok(tokio::spawn(watch_signals(
        signals,
        stop.clone(),
        config
            .businesses
            .iter()
            .map(|b| b.shutdown_timeout)
            .zip(deadlines.iter().cloned())
            .collect(),
    )))
}

/// Binds the HTTP listener, unless it is off, and serves it from now on.
async fn serve_http(
    config: &Config,
    redis_health: &Arc<Health>,
    broker: &Broker,
) -> Result<Option<Arc<HttpState>>, RunError> {
    let Some(listen) = config.http_listen else {
        return Ok(None);
    };
    let state = HttpState::new(redis_health.clone(), broker.health.clone(), config);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| RunError::Http(listen, e))?;
    let serving = state.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::http::serve(listener, serving).await {
            tracing::error!(%listen, error = %e, "HTTP server stopped");
        }
    });
    Ok(Some(state))
}

/// One lane per key a business reads (its shards, or `K`).
fn lanes(config: &Config, conn: &RedisConn, redis_health: &Arc<Health>) -> Vec<Arc<Lane>> {
    let mut lanes = Vec::new();
    for b in &config.businesses {
        let business = Arc::new(b.clone());
        let limiter = Limiter::for_business(b, conn);
        for key in b.keys() {
            lanes.push(Arc::new(Lane {
                business: business.clone(),
                store: Store::of_business(conn.clone(), &key, b),
                lead_wake: Notify::new(),
                all_wake: Notify::new(),
                express_wake: Notify::new(),
                notifications: AtomicBool::new(false),
                limiter: limiter.clone(),
                redis: redis_health.clone(),
                lead_claims: std::sync::atomic::AtomicU64::new(0),
                pause: Default::default(),
                fair: b
                    .tenants
                    .clone()
                    .map(|t| crate::tenants::Fair::new(t, b.shards)),
            }));
        }
    }
    lanes
}

/// Each business once, as its lanes share it.
fn distinct_businesses(lanes: &[Arc<Lane>]) -> Vec<Arc<Business>> {
    let mut businesses: Vec<Arc<Business>> = Vec::new();
    for l in lanes {
        if !businesses.iter().any(|b| Arc::ptr_eq(b, &l.business)) {
            businesses.push(l.business.clone());
        }
    }
    businesses
}

/// `scanners` claim-and-publish loops per lane (and the express scanner
/// of a business with tenants), each supervised.
fn spawn_scanners(
    config: &Config,
    lanes: &[Arc<Lane>],
    broker: &Broker,
    stop: &CancellationToken,
    deadlines: &[Deadline],
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for lane in lanes {
        let bi = config
            .businesses
            .iter()
            .position(|b| b.name == lane.business.name)
            .unwrap_or(0);
        // A business with tenants has one more: the express scanner.
        let express = usize::from(lane.fair.is_some());
        for index in 0..lane.business.scanners + express {
            tasks.push(tokio::spawn(supervise_scanner(
                lane.clone(),
                index,
                broker.clone(),
                stop.clone(),
                deadlines[bi].clone(),
            )));
        }
    }
    tasks
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

/// How often the keyspace watcher re-reads where the masters are. A
/// cluster's masters change on failover and resharding; a standalone
/// server's flags are re-read now and then in case an operator turned the
/// events on.
fn topology_interval(mode: RedisMode) -> Duration {
    match mode {
        RedisMode::Standalone => Duration::from_secs(60),
        RedisMode::Cluster | RedisMode::Sentinel => Duration::from_secs(1),
    }
}

/// What one master's subscriber reports to the watcher.
#[derive(Default)]
struct NodeState {
    /// The node publishes zset keyspace events (or we could not ask).
    enabled: AtomicBool,
    /// Subscribed and receiving.
    subscribed: AtomicBool,
    /// The node's flags, for the log.
    flags: std::sync::Mutex<Option<String>>,
}

/// Subscribes to keyspace events of every key on every master, as wake-up
/// hints only: keyspace events are published by the node that holds the
/// key, so a cluster needs a subscription per master, redone when the
/// masters change. Scanners count on the hints (sleeping up to
/// `watchdog_interval`) only while every master is subscribed with the
/// events on; otherwise they poll every `poll_interval`.
async fn watch_keyspace(
    redis: Redis,
    conn: RedisConn,
    lanes: Vec<Arc<Lane>>,
    stop: CancellationToken,
) {
    let changed = Arc::new(Notify::new());
    let mut nodes: std::collections::BTreeMap<
        String,
        (tokio::task::JoinHandle<()>, Arc<NodeState>),
    > = Default::default();
    let mut reported: Option<bool> = None;
    let mut failed_logged = false;
    let interval = topology_interval(redis.mode());
    loop {
        match conn.masters(&redis).await {
            Ok(masters) if !masters.is_empty() => {
                failed_logged = false;
                let wanted: std::collections::BTreeMap<String, crate::redis_conn::Master> = masters
                    .into_iter()
                    .map(|m| (m.addr.to_string(), m))
                    .collect();
                nodes.retain(|addr, (task, _)| {
                    let keep = wanted.contains_key(addr);
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for (addr, m) in wanted {
                    if nodes.contains_key(&addr) {
                        continue;
                    }
                    match conn.subscriber(&redis, &m) {
                        Ok(client) => {
                            let state = Arc::new(NodeState::default());
                            let task = tokio::spawn(subscribe_node(
                                client,
                                addr.clone(),
                                redis.db(),
                                lanes.clone(),
                                state.clone(),
                                changed.clone(),
                                stop.clone(),
                            ));
                            nodes.insert(addr, (task, state));
                        }
                        Err(e) => tracing::debug!(error = %e, "cannot subscribe on a master"),
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                if !failed_logged {
                    tracing::debug!(error = %e, "cannot list the masters for keyspace subscriptions; polling meanwhile");
                    failed_logged = true;
                }
            }
        }
        let all_on = !nodes.is_empty()
            && nodes.values().all(|(_, s)| {
                s.subscribed.load(Ordering::Relaxed) && s.enabled.load(Ordering::Relaxed)
            });
        for l in &lanes {
            l.notifications.store(all_on, Ordering::Relaxed);
        }
        let any_off = nodes
            .values()
            .any(|(_, s)| !s.enabled.load(Ordering::Relaxed));
        let decided = all_on || any_off;
        if decided && reported != Some(all_on) {
            let flags: Vec<String> = nodes
                .iter()
                .map(|(a, (_, s))| {
                    let f = s.flags.lock().ok().and_then(|f| f.clone());
                    format!("{a}={}", f.as_deref().unwrap_or("unknown"))
                })
                .collect();
            if all_on {
                tracing::info!(flags = %flags.join(" "), masters = nodes.len(), "keyspace notifications on: idle scanners wake on ZADD and sleep until the next due time");
            } else {
                tracing::info!(flags = %flags.join(" "), "keyspace notifications off on some master: idle scanners poll every poll_interval; for millisecond lateness run CONFIG SET notify-keyspace-events Kz on every master");
            }
            reported = Some(all_on);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
            _ = changed.notified() => {}
        }
    }
    for (task, _) in nodes.into_values() {
        task.abort();
    }
}

/// Keeps one subscription on one master: reads its flags, subscribes to
/// every lane's channel (only the keys it holds will ever publish), wakes
/// the lanes whenever a member may have become due sooner, and starts
/// over, with backoff, when the stream drops.
async fn subscribe_node(
    client: redis::Client,
    addr: String,
    db: i64,
    lanes: Vec<Arc<Lane>>,
    state: Arc<NodeState>,
    changed: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let sleep = |d: Duration| {
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => false,
                _ = tokio::time::sleep(d) => true,
            }
        }
    };
    loop {
        let Some(flags) = node_flags(&client, &addr).await else {
            if !sleep(backoff.next_delay()).await {
                return;
            }
            continue;
        };
        let enabled = flags
            .as_deref()
            .map(crate::store::flags_notify_zsets)
            .unwrap_or(true);
        if let Ok(mut f) = state.flags.lock() {
            *f = flags;
        }
        state.enabled.store(enabled, Ordering::Relaxed);
        if !enabled {
            changed.notify_one();
            if !sleep(Duration::from_secs(60)).await {
                return;
            }
            continue;
        }
        let Some((pubsub, channels)) = subscribe_lanes(&client, &addr, db, &lanes).await else {
            if !sleep(backoff.next_delay()).await {
                return;
            }
            continue;
        };
        backoff.reset();
        state.subscribed.store(true, Ordering::Relaxed);
        changed.notify_one();
        // Anything added while we were not subscribed is found by a poll.
        for l in &lanes {
            l.lead_wake.notify_one();
        }
        if !relay(pubsub, &channels, &addr, &stop).await {
            return;
        }
        state.subscribed.store(false, Ordering::Relaxed);
        changed.notify_one();
        // A node that drops every subscription at once must not be hammered.
        if !sleep(backoff.next_delay()).await {
            return;
        }
    }
}

/// The node's `notify-keyspace-events` flags (`None` inside where CONFIG is
/// refused), after a warning if its eviction policy could drop members;
/// `None` when the node does not answer.
async fn node_flags(client: &redis::Client, addr: &str) -> Option<Option<String>> {
    let connect = client.get_multiplexed_async_connection();
    let Ok(Ok(mut c)) = tokio::time::timeout(crate::redis_conn::CONNECT_TIMEOUT, connect).await
    else {
        return None;
    };
    if let Some(risk) = crate::store::eviction_risk(&mut c).await {
        tracing::warn!(node = %addr, "{risk}");
    }
    // Managed services often forbid CONFIG; subscribing anyway costs
    // nothing and works when the operator enabled the events.
    Some(crate::store::keyspace_flags(&mut c).await)
}

/// Lanes by the keyspace channels of their keys: the pending key, and with
/// tenants the tenants' index (true).
type Channels = std::collections::HashMap<Vec<u8>, (Arc<Lane>, bool)>;

/// A subscription to every lane's keyspace channel on this node (only the
/// keys it holds will ever publish); `None` when it cannot be made.
async fn subscribe_lanes(
    client: &redis::Client,
    addr: &str,
    db: i64,
    lanes: &[Arc<Lane>],
) -> Option<(redis::aio::PubSub, Channels)> {
    let pubsub = tokio::time::timeout(
        crate::redis_conn::CONNECT_TIMEOUT,
        client.get_async_pubsub(),
    );
    let mut pubsub = match pubsub.await {
        Ok(Ok(p)) => p,
        other => {
            if let Ok(Err(e)) = other {
                tracing::debug!(node = %addr, error = %e, "keyspace subscription failed; polling meanwhile");
            }
            return None;
        }
    };
    let mut channels = Channels::new();
    for l in lanes {
        let mut keys = vec![(l.store.keys().pending.clone(), false)];
        if l.fair.is_some() {
            // Producers of a business with tenants write the index too.
            keys.push((l.store.keys().tenant_index(), true));
        }
        for (key, index) in keys {
            let ch = format!("__keyspace@{db}__:{key}");
            pubsub.subscribe(&ch).await.ok()?;
            channels.insert(ch.into_bytes(), (l.clone(), index));
        }
    }
    Some((pubsub, channels))
}

/// Wakes a lane whenever an event on its channel may have made a member due
/// sooner. Returns false at `stop`; true when the stream drops or after a
/// minute, for the caller to read the flags again.
async fn relay(
    pubsub: redis::aio::PubSub,
    channels: &Channels,
    addr: &str,
    stop: &CancellationToken,
) -> bool {
    let mut stream = pubsub.into_on_message();
    let recheck = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(recheck);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = &mut recheck => return true,
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
                        if let Some((l, index)) = channels.get(msg.get_channel_name().as_bytes()) {
                            l.lead_wake.notify_one();
                            if *index {
                                l.express_wake.notify_one();
                            }
                        }
                    }
                }
                None => {
                    tracing::debug!(node = %addr, "keyspace subscription dropped; polling until it is back");
                    return true;
                }
            }
        }
    }
}
