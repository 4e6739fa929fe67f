//! The RabbitMQ side: supervised connections (to one of the configured nodes
//! at a time, clear text or TLS), one for publishing and one for the
//! intakes' consuming, and confirm-mode channels for the scanners.

mod nodes;
pub mod unreadable;

pub use nodes::{parse_uri, Nodes};

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, Event};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::AmqpConfig;
use crate::telemetry::{Backoff, Health, METRICS};

/// A RabbitMQ failure.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// The URL does not parse.
    #[error("[amqp] url {url} is not a valid AMQP URL: {reason}")]
    Url {
        /// The URL, password masked.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A node could not be reached, or refused delayd.
    #[error("RabbitMQ node {node}: {reason}")]
    Connect {
        /// The node's URL, password masked.
        node: String,
        /// What went wrong and what to do about it.
        reason: String,
    },
    /// The TLS files are unusable.
    #[error("{0}")]
    Tls(String),
    /// The broker refused or dropped something.
    #[error("{0}")]
    Lapin(#[from] lapin::Error),
    /// Opening a channel got no answer in time.
    #[error("no answer to opening a channel within {0:?}; the connection is presumably dead")]
    ChannelTimeout(Duration),
}

/// How long delayd waits after losing a cluster node before connecting to
/// the next one; see `supervise`.
const FAILOVER_PAUSE: Duration = Duration::from_secs(2);

/// Opening a channel is two round trips. On a connection that died just as
/// it was used, lapin may never answer, which would wedge the scanner: bound it.
const CHANNEL_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// The user delayd logs in as, when the configuration says: the same user
/// in every URL, none of them logging in by certificate (EXTERNAL takes the
/// user from the certificate).
pub fn login_user(cfg: &AmqpConfig) -> Option<String> {
    let mut users = cfg.urls.iter().map(|u| {
        let uri = parse_uri(u).ok()?;
        let external = uri.query.auth_mechanism == Some(lapin::uri::SASLMechanism::External);
        (!external).then_some(uri.authority.userinfo.username)
    });
    let first = users.next()??;
    users.all(|u| u.as_ref() == Some(&first)).then_some(first)
}

/// Opens one connection for a command that needs no supervision: to the
/// first node that answers, trying each once from a random start.
pub async fn connect(cfg: &AmqpConfig, name: &str) -> Result<Connection, AmqpError> {
    let nodes = Nodes::new(cfg)?;
    let start = rand::random_range(0..nodes.len());
    let mut last = None;
    for i in start..start + nodes.len() {
        match nodes.connect(i, name, false).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(AmqpError::Tls("[amqp] no node configured".into())))
}

/// What a connection carries. RabbitMQ blocks a connection that publishes
/// while a resource alarm is raised, and everything else on it with it, so
/// consuming gets a connection of its own, as RabbitMQ's documentation
/// advises: the intakes go on draining their queues into Redis during an
/// alarm, which is what relieves the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The scanners' publishing: waits while the broker blocks publishers.
    Publish,
    /// The intakes' consuming: never publishes, so it is never blocked.
    Consume,
}

impl Role {
    /// The connection's name on the broker (its management UI shows it).
    fn connection_name(self) -> &'static str {
        match self {
            Role::Publish => "delayd",
            Role::Consume => "delayd intake",
        }
    }

    /// The `server` label of `delayd_connection_up` and the name in
    /// outage lines.
    fn server(self) -> &'static str {
        match self {
            Role::Publish => "amqp",
            Role::Consume => "amqp_intake",
        }
    }
}

/// A shared, supervised connection: scanners ask it for channels and wait
/// while it is down or blocked; it reconnects with backoff by itself.
#[derive(Clone)]
pub struct Broker {
    conn: watch::Receiver<Option<Arc<Connection>>>,
    blocked: watch::Receiver<bool>,
    /// Reachability, for `/readyz` and outage logging.
    pub health: Arc<Health>,
}

impl Broker {
    /// Starts the supervisor of a connection for `role`; it runs until
    /// `stop` is cancelled.
    pub fn start(cfg: &AmqpConfig, role: Role, stop: CancellationToken) -> Result<Self, AmqpError> {
        let nodes = Nodes::new(cfg)?;
        let health = Health::new(role.server());
        let (conn_tx, conn_rx) = watch::channel(None);
        let (blocked_tx, blocked_rx) = watch::channel(false);
        let watch = Watch {
            conn_tx,
            blocked_tx,
            health: health.clone(),
            role,
        };
        tokio::spawn(supervise(nodes, watch, stop));
        Ok(Self {
            conn: conn_rx,
            blocked: blocked_rx,
            health,
        })
    }

    /// Waits until the broker is connected and not blocking publishers, then
    /// opens a channel in confirm mode. `None` if `cancel` fires first.
    pub async fn channel(&self, cancel: &CancellationToken) -> Option<Result<Channel, AmqpError>> {
        let conn = self.ready(cancel).await?;
        let open = async {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, AmqpError>(ch)
        };
        let result = tokio::select! {
            _ = cancel.cancelled() => return None,
            r = tokio::time::timeout(CHANNEL_OPEN_TIMEOUT, open) => {
                r.unwrap_or(Err(AmqpError::ChannelTimeout(CHANNEL_OPEN_TIMEOUT)))
            }
        };
        Some(result)
    }

    /// Waits until connected and unblocked; `None` if `cancel` fires first.
    pub async fn ready(&self, cancel: &CancellationToken) -> Option<Arc<Connection>> {
        let mut conn = self.conn.clone();
        let mut blocked = self.blocked.clone();
        loop {
            let current = conn.borrow_and_update().clone();
            let is_blocked = *blocked.borrow_and_update();
            if let Some(c) = current {
                if !is_blocked && c.status().connected() {
                    return Some(c);
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = conn.changed() => {}
                _ = blocked.changed() => {}
                // The supervisor notices a dead connection by its events; this
                // bounds the wait should a status change slip between them.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// True while the broker blocks publishing (memory or disk alarm).
    pub fn is_blocked(&self) -> bool {
        *self.blocked.borrow()
    }
}

/// What a connection's supervisor tells the rest of the process.
struct Watch {
    conn_tx: watch::Sender<Option<Arc<Connection>>>,
    blocked_tx: watch::Sender<bool>,
    health: Arc<Health>,
    role: Role,
}

impl Watch {
    /// The broker blocked publishing (`Some(reason)`) or unblocked it. Only
    /// the publishing connection waits for that; RabbitMQ does not block a
    /// connection that never publishes, so the intakes go on.
    fn blocked(&self, reason: Option<&str>) {
        match (self.role, reason) {
            (Role::Publish, Some(reason)) => {
                tracing::warn!(%reason, "RabbitMQ blocks publishing (resource alarm); claiming paused");
                METRICS.amqp_blocked.set(1);
                self.blocked_tx.send_replace(true);
            }
            (Role::Publish, None) => {
                tracing::info!("RabbitMQ unblocked publishing; claiming resumes");
                self.unblocked_quietly();
            }
            (Role::Consume, Some(reason)) => {
                tracing::info!(%reason, "RabbitMQ raised a resource alarm; the intakes go on taking messages in");
            }
            (Role::Consume, None) => {}
        }
    }

    /// A new connection starts unblocked.
    fn unblocked_quietly(&self) {
        if self.role == Role::Publish {
            METRICS.amqp_blocked.set(0);
        }
        self.blocked_tx.send_replace(false);
    }
}

/// Keeps one connection open, to the nodes in rotation from a random start:
/// a lost or refusing node is followed at once by the next, and only a full
/// round of failures waits out a backoff.
async fn supervise(nodes: Nodes, watch: Watch, stop: CancellationToken) {
    let Watch {
        conn_tx, health, ..
    } = &watch;
    // Capped at 5 s: with jitter a retry then comes at most 5 s after the
    // broker is back, so delivery resumes within 10 s of a restart.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut next = rand::random_range(0..nodes.len());
    let mut failures_in_round = 0;
    loop {
        let node = next;
        next = (next + 1) % nodes.len();
        let attempt = tokio::select! {
            _ = stop.cancelled() => return,
            r = nodes.connect(node, watch.role.connection_name(), watch.role == Role::Consume) => r,
        };
        match attempt {
            Ok(conn) => {
                let connected_at = tokio::time::Instant::now();
                failures_in_round = 0;
                health.up();
                tracing::info!(node = nodes.name(node), "connected to RabbitMQ");
                let conn = Arc::new(conn);
                let events = conn.events_listener();
                conn_tx.send_replace(Some(conn.clone()));
                if !hold(&conn, events, &watch, nodes.name(node), &stop).await {
                    return;
                }
                conn_tx.send_replace(None);
                watch.unblocked_quietly();
                // A connection that lived a while was healthy: the next one
                // is tried at once (after the failover pause). One the broker
                // dropped soon after the handshake backs off like a refusal,
                // or a broker that accepts and drops would be hammered.
                if connected_at.elapsed() >= HEALTHY_CONNECTION {
                    backoff.reset();
                } else {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                if nodes.len() > 1 {
                    tracing::warn!(
                        lost = nodes.name(node),
                        next = nodes.name(next),
                        "lost the RabbitMQ node; connecting to the next one"
                    );
                    // The cluster needs a moment to notice the loss and elect
                    // new quorum queue leaders: RabbitMQ 3.10 nacks every
                    // publish, for a minute and more, on a channel opened on
                    // a follower in the instant after a leader died.
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(FAILOVER_PAUSE) => {}
                    }
                }
            }
            Err(e) => {
                health.down(&e);
                tracing::debug!(error = %e, "RabbitMQ node refused or unreachable");
                failures_in_round += 1;
                if failures_in_round >= nodes.len() {
                    failures_in_round = 0;
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

/// Watches a live connection through its `events`: relays the broker's
/// blocking, and returns true once the connection is lost, or false at
/// `stop`, after closing it.
async fn hold(
    conn: &Arc<Connection>,
    mut events: impl futures::Stream<Item = Event> + Unpin,
    watch: &Watch,
    node: &str,
    stop: &CancellationToken,
) -> bool {
    let health = &watch.health;
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                let _ = conn.close(200, "delayd stopping".into()).await;
                watch.conn_tx.send_replace(None);
                return false;
            }
            ev = events.next() => match ev {
                Some(Event::ConnectionBlocked(reason)) => watch.blocked(Some(reason.as_str())),
                Some(Event::ConnectionUnblocked) => watch.blocked(None),
                // Channel errors arrive here too; only a dead
                // connection needs a new one.
                Some(Event::Error(e)) if !conn.status().connected() => {
                    health.down(&format_args!("RabbitMQ node {node}: connection lost ({e})"));
                    return true;
                }
                None => {
                    health.down(&format_args!("RabbitMQ node {node}: connection lost (event stream ended)"));
                    return true;
                }
                _ => {}
            },
            _ = check.tick() => {
                if !conn.status().connected() {
                    health.down(&format_args!("RabbitMQ node {node}: connection closed"));
                    return true;
                }
            }
        }
    }
}

/// How long a connection must have lived to count as healthy, so that the
/// reconnect backoff starts over.
const HEALTHY_CONNECTION: Duration = Duration::from_secs(30);

/// Publishes one message (see [`crate::message`]) to `exchange`, with
/// `mandatory` so an unroutable publish comes back.
pub async fn publish(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<lapin::PublisherConfirm, lapin::Error> {
    let mandatory = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    channel
        .basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key),
            mandatory,
            body,
            properties,
        )
        .await
}

/// Returns once lapin has finished handling the confirm frame it may be
/// handling on `channel`; nothing is awaited.
///
/// lapin completes every delivery tag of one `basic.ack` or `basic.nack`
/// (a `multiple` one covers many) while holding the channel's lock of
/// confirms, and `wait_for_confirms` takes that lock on its first poll:
/// once it has, every confirm that frame completes has resolved, the one
/// carrying a pinned `basic.return` among them. The future is dropped after
/// that one poll (it would wait for the last publish's confirm, which the
/// settler reads from the confirms themselves).
pub fn confirm_frames_done(channel: &Channel) {
    let _ = channel.wait_for_confirms().now_or_never();
}

/// Checks that `exchange` exists without creating it (a passive declare).
/// A missing exchange closes the channel, so each check gets its own.
pub async fn exchange_exists(conn: &Connection, exchange: &str) -> Result<(), AmqpError> {
    if exchange.is_empty() {
        return Ok(());
    }
    let ch = conn.create_channel().await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    declare_direct(&ch, exchange, passive).await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(())
}

/// Declares a durable direct exchange (idempotent).
pub async fn declare_exchange(ch: &Channel, exchange: &str) -> Result<(), lapin::Error> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_direct(ch, exchange, durable).await
}

async fn declare_direct(
    ch: &Channel,
    exchange: &str,
    options: ExchangeDeclareOptions,
) -> Result<(), lapin::Error> {
    let kind = lapin::ExchangeKind::Direct;
    ch.exchange_declare(exchange.into(), kind, options, FieldTable::default())
        .await
}

/// Declares a durable direct exchange and a durable queue (with
/// `queue_args`) bound to it by `routing_key`: the topology `delayd bench`
/// publishes into, and the tests too.
pub async fn declare_bound_queue(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    routing_key: &str,
    queue_args: FieldTable,
) -> Result<(), lapin::Error> {
    declare_exchange(ch, exchange).await?;
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        queue_args,
    )
    .await?;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        routing_key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(urls: &[&str]) -> AmqpConfig {
        AmqpConfig {
            urls: urls
                .iter()
                .map(|u| crate::secret::SecretUrl::new(*u))
                .collect(),
            tls: Default::default(),
            connect_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn login_user_is_the_urls_one_user_unless_a_certificate_logs_in() {
        assert_eq!(
            login_user(&amqp(&["amqp://shop:pw@h/%2f"])).as_deref(),
            Some("shop")
        );
        assert_eq!(
            login_user(&amqp(&["amqp://h/%2f"])).as_deref(),
            Some("guest")
        );
        let two = ["amqp://a:pw@h1/%2f", "amqp://a:pw@h2/%2f"];
        assert_eq!(login_user(&amqp(&two)).as_deref(), Some("a"));
        assert_eq!(
            login_user(&amqp(&["amqp://a:pw@h1/%2f", "amqp://b:pw@h2/%2f"])),
            None
        );
        assert_eq!(
            login_user(&amqp(&["amqps://h/%2f?auth_mechanism=external"])),
            None
        );
    }
}
