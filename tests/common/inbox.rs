//! RabbitMQ side of the tests: exchanges and queues, and the consumers that
//! record every message they receive.

use super::*;

/// An AMQP connection to the shared (or a given) server.
pub async fn amqp_at(url: &str) -> Connection {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(url, ConnectionProperties::default()),
    )
    .await
    .expect("RabbitMQ did not answer within 10s")
    .expect("cannot connect to RabbitMQ")
}

/// A connection to the shared server and a channel on it.
pub async fn amqp_channel() -> (Connection, Channel) {
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    (amqp, ch)
}

/// Declares a durable direct exchange and a queue bound to it with `routing_key`.
pub async fn declare(ch: &Channel, exchange: &str, queue: &str, routing_key: &str) {
    declare_with(ch, exchange, queue, routing_key, FieldTable::default()).await
}

/// Declares a durable direct exchange, with no queue bound to it.
pub async fn declare_exchange(ch: &Channel, exchange: &str) {
    delayd::amqp::declare_exchange(ch, exchange).await.unwrap();
}

/// Like [`declare`], with queue arguments (e.g. `x-max-length`).
pub async fn declare_with(
    ch: &Channel,
    exchange: &str,
    queue: &str,
    routing_key: &str,
    args: FieldTable,
) {
    delayd::amqp::declare_bound_queue(ch, exchange, queue, routing_key, args)
        .await
        .unwrap();
}

/// One received message.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Vec<u8>,
    pub at_ms: i64,
    pub headers: HashMap<String, AMQPValue>,
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
    pub content_type: Option<String>,
    /// The routing key the message was published with.
    pub routing_key: String,
    /// Every property as the broker delivered it.
    pub properties: lapin::BasicProperties,
}

impl Received {
    /// `x-delayd-due`, epoch ms.
    pub fn due(&self) -> i64 {
        match self.headers.get("x-delayd-due") {
            Some(AMQPValue::LongLongInt(v)) => *v,
            other => panic!("x-delayd-due missing or odd: {other:?}"),
        }
    }
}

/// Messages collected by a background consumer.
#[derive(Clone, Default)]
pub struct Inbox(pub Arc<Mutex<Vec<Received>>>);

impl Inbox {
    /// Messages received so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    /// Whether none was received yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn all(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
    /// The distinct bodies received so far.
    pub fn bodies(&self) -> HashSet<Vec<u8>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }
    /// Waits until at least `n` messages arrived; panics after `limit`.
    pub async fn wait_for(&self, n: usize, limit: Duration) {
        let start = Instant::now();
        while self.len() < n {
            if start.elapsed() > limit {
                panic!(
                    "only {} of {n} messages arrived within {limit:?}: {}",
                    self.len(),
                    self.first_bodies(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    /// The first `n` bodies received, as text, for a failure's message.
    fn first_bodies(&self, n: usize) -> String {
        let got = self.all();
        let shown: Vec<String> = got
            .iter()
            .take(n)
            .map(|r| String::from_utf8_lossy(&r.body[..r.body.len().min(40)]).into_owned())
            .collect();
        format!("{shown:?}{}", if got.len() > n { " ..." } else { "" })
    }
    /// Waits until no message has arrived for `quiet`.
    pub async fn settle(&self, quiet: Duration) {
        let mut last = self.len();
        loop {
            tokio::time::sleep(quiet).await;
            let now = self.len();
            if now == last {
                return;
            }
            last = now;
        }
    }
}

/// Consumes `queue` in the background, recording every message's receipt time.
pub async fn consume(conn: &Connection, queue: &str) -> Inbox {
    let inbox = Inbox::default();
    consume_into(conn, queue, &inbox, false).await;
    inbox
}

/// Like [`consume`], but into an existing inbox and, with `ack`, acknowledging
/// each message only after it is recorded: a message the consumer never saw is
/// requeued by the broker instead of lost when the connection drops.
pub async fn consume_into(conn: &Connection, queue: &str, inbox: &Inbox, ack: bool) {
    let ch = conn.create_channel().await.unwrap();
    if ack {
        ch.basic_qos(500, BasicQosOptions::default()).await.unwrap();
    }
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            unique("ctag").as_str().into(),
            BasicConsumeOptions {
                no_ack: !ack,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let out = inbox.clone();
    tokio::spawn(async move {
        let _keep = ch;
        while let Some(Ok(d)) = consumer.next().await {
            let headers = d
                .properties
                .headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            out.0.lock().unwrap().push(Received {
                body: d.data.clone(),
                at_ms: wall_ms(),
                headers,
                message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
                delivery_mode: *d.properties.delivery_mode(),
                content_type: d.properties.content_type().as_ref().map(|s| s.to_string()),
                routing_key: d.routing_key.to_string(),
                properties: d.properties.clone(),
            });
            if ack && d.ack(BasicAckOptions::default()).await.is_err() {
                break;
            }
        }
    });
}

/// `queue` as a passive declare sees it (its message and consumer counts),
/// or the broker's refusal (it does not exist). Each declare gets a channel
/// of its own, since a refusal closes the channel it was asked on.
async fn passive_queue(conn: &Connection, queue: &str) -> Result<lapin::Queue, lapin::Error> {
    let ch = conn.create_channel().await.unwrap();
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch.queue_declare(queue.into(), options, FieldTable::default());
    let q = q.await?;
    let _ = ch.close(200, "ok".into()).await;
    Ok(q)
}

/// Messages waiting in `queue` (a passive declare: the queue must exist).
pub async fn queue_depth(conn: &Connection, queue: &str) -> u32 {
    passive_queue(conn, queue).await.unwrap().message_count()
}

/// Extracts the members of every message, sorted, and the count of each.
pub fn counts(inbox: &Inbox) -> HashMap<Vec<u8>, usize> {
    let mut m = HashMap::new();
    for r in inbox.all() {
        *m.entry(r.body).or_insert(0) += 1;
    }
    m
}

/// Waits until every body in `want` has arrived at least once; panics after
/// `limit` with the count missing and the tail of the daemon's log.
pub async fn wait_all(inbox: &Inbox, want: &HashSet<Vec<u8>>, limit: Duration, d: &Daemon) {
    let start = Instant::now();
    loop {
        let got = inbox.bodies();
        if want.is_subset(&got) {
            return;
        }
        if start.elapsed() > limit {
            panic!(
                "{} of {} members not delivered within {limit:?}; daemon log:\n{}",
                want.difference(&got).count(),
                want.len(),
                d.tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Declares `queue` bound to the business's exchange and consumes it.
pub async fn bind_and_consume(
    conn: &Connection,
    ch: &Channel,
    b: &BusinessSpec,
    queue: &str,
) -> Inbox {
    declare(ch, &b.exchange, queue, &b.routing_key).await;
    consume(conn, queue).await
}

/// Waits until `queue` exists with a consumer (delayd's); panics after 20 s.
pub async fn wait_consumed_queue(amqp: &Connection, queue: &str, d: &Daemon) {
    let ok = eventually(Duration::from_secs(20), || async {
        passive_queue(amqp, queue)
            .await
            .is_ok_and(|q| q.consumer_count() > 0)
    })
    .await;
    assert!(
        ok,
        "delayd did not consume {queue} within 20s:\n{}",
        d.tail()
    );
}

/// Waits until nothing consumes `queue`: after a kill, RabbitMQ still counts
/// the dead instance's consumer until it notices the closed socket.
pub async fn wait_unconsumed_queue(amqp: &Connection, queue: &str) {
    let gone = eventually(Duration::from_secs(20), || async {
        passive_queue(amqp, queue)
            .await
            .is_ok_and(|q| q.consumer_count() == 0)
    })
    .await;
    assert!(gone, "{queue} still has a consumer after 20s");
}

impl Inbox {
    /// True once every body in `want` has arrived at least once; false
    /// after `limit` (the caller says what that means).
    pub async fn eventually_has(&self, want: &HashSet<Vec<u8>>, limit: Duration) -> bool {
        eventually(limit, || {
            let done = want.is_subset(&self.bodies());
            async move { done }
        })
        .await
    }
}

/// Binds `queue` to `exchange` by `key`.
pub async fn bind_key(ch: &Channel, queue: &str, exchange: &str, key: &str) {
    let (q, ex) = (queue.into(), exchange.into());
    ch.queue_bind(q, ex, key.into(), Default::default(), FieldTable::default())
        .await
        .unwrap();
}

/// Binds `queue` to the business's exchange by its routing key, or with
/// `bound = false` takes that binding away (a queue the flow loses and finds
/// again).
pub async fn set_bound(ch: &Channel, queue: &str, b: &BusinessSpec, bound: bool) {
    if bound {
        return bind_key(ch, queue, &b.exchange, &b.routing_key).await;
    }
    let (ex, rk) = (b.exchange.as_str(), b.routing_key.as_str());
    ch.queue_unbind(queue.into(), ex.into(), rk.into(), FieldTable::default())
        .await
        .unwrap();
}

/// Declares a durable exchange of `kind` (headers, topic, fanout).
pub async fn declare_exchange_kind(ch: &Channel, exchange: &str, kind: lapin::ExchangeKind) {
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(exchange.into(), kind, options, FieldTable::default())
        .await
        .unwrap();
}

/// Declares a durable queue bound to nothing (the test binds it).
pub async fn declare_queue(ch: &Channel, queue: &str) {
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), options, FieldTable::default())
        .await
        .unwrap();
}

/// Whether `queue` exists (a passive declare on a channel of its own).
pub async fn queue_exists(conn: &Connection, queue: &str) -> bool {
    passive_queue(conn, queue).await.is_ok()
}

/// Deletes what a test declared: `queues`, then `exchanges`. A name that is
/// already gone is no error (the test may have deleted it itself).
pub async fn delete_topology(ch: &Channel, queues: &[&str], exchanges: &[&str]) {
    for q in queues {
        let _ = ch.queue_delete((*q).into(), Default::default()).await;
    }
    for x in exchanges {
        let _ = ch.exchange_delete((*x).into(), Default::default()).await;
    }
}

impl Inbox {
    /// The first message received with `body`, if any.
    pub fn find(&self, body: &[u8]) -> Option<Received> {
        self.all().into_iter().find(|m| m.body == body)
    }
}

impl Inbox {
    /// Asserts that exactly the members `want` arrived, each once; `after`
    /// names what could have duplicated one (a clean stop, a failover).
    pub fn assert_each_once(&self, want: &HashSet<Vec<u8>>, after: &str) -> Vec<Received> {
        let got = self.all();
        let bodies: HashSet<Vec<u8>> = got.iter().map(|r| r.body.clone()).collect();
        let missing = want.difference(&bodies).count();
        assert_eq!(
            missing,
            0,
            "{missing} of {} members not delivered",
            want.len()
        );
        assert_eq!(
            bodies.len(),
            want.len(),
            "members delivered that were never scheduled"
        );
        assert_eq!(
            got.len(),
            want.len(),
            "a member delivered twice after {after}"
        );
        got
    }
}

/// Properties with one `x-delay` header and `delivery_mode = 2`, as an
/// intake's producers publish.
pub fn delayed(v: AMQPValue) -> lapin::BasicProperties {
    let mut h = FieldTable::default();
    h.insert("x-delay".into(), v);
    lapin::BasicProperties::default()
        .with_headers(h)
        .with_delivery_mode(2)
}

/// Publishes `body` to `exchange` with `routing_key` and `props`; returns
/// the broker's confirm, for [`assert_acked`] on a channel in confirm mode.
pub async fn publish_props(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: lapin::BasicProperties,
) -> lapin::PublisherConfirm {
    ch.basic_publish(
        exchange.into(),
        routing_key.into(),
        BasicPublishOptions::default(),
        body,
        props,
    )
    .await
    .unwrap()
}

/// Waits up to `limit` for each confirm and asserts the broker acked it.
pub async fn assert_acked(confirms: Vec<lapin::PublisherConfirm>, limit: Duration) {
    for c in confirms {
        let ok = tokio::time::timeout(limit, c)
            .await
            .unwrap_or_else(|_| panic!("no confirm within {limit:?}"))
            .unwrap();
        assert!(ok.is_ack(), "the broker nacked a publish");
    }
}

/// Waits until at least `n` messages arrived; panics after `limit` with
/// the tail of `d`'s log.
pub async fn wait_n(inbox: &Inbox, n: usize, limit: Duration, d: &Daemon) {
    let start = Instant::now();
    while inbox.len() < n {
        assert!(
            start.elapsed() < limit,
            "only {} of {n} messages arrived within {limit:?}; log:\n{}",
            inbox.len(),
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
