//! The intake against real servers: producers publish with `x-delay` to an
//! intake exchange, as they did to the delayed-message plugin, and
//! consumers of the target exchange receive the message when it is due.
//!
//! The first tests port the plugin's own suite (`test/plugin_SUITE.erl` of
//! rabbitmq-delayed-message-exchange): routing through topic, direct and
//! fanout targets with that suite's binding and routing keys, delay order,
//! string delays, exchange-to-exchange bindings, counting, and a restart
//! before the delays expire (of delayd here, of the node there).

use delayd_test_support as common;

use common::*;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use lapin::options::*;

/// One intake business on the shared servers: its target exchange (of the
/// type the plugin's `x-delayed-type` named) with a consumed queue bound by
/// `binding_keys`, the intake exchange producers publish to, and a config.
struct Intake {
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    name: String,
    key: String,
    target: String,
    exchange: String,
    queue: String,
    consumer_queue: String,
    amqp: Connection,
    /// A confirm-mode channel for producers.
    ch: Channel,
    inbox: Inbox,
    redis: redis::aio::MultiplexedConnection,
}

impl Intake {
    /// A target of type `kind` bound by `binding_keys`; `business` and
    /// `intake` are extra lines for the two config sections.
    async fn new(kind: ExchangeKind, binding_keys: &[&str], business: &str, intake: &str) -> Self {
        let amqp = amqp_at(&amqp_url()).await;
        let admin = amqp.create_channel().await.unwrap();
        let target = unique("target");
        let consumer_queue = unique("consumer");
        declare_target(&admin, &target, kind, &consumer_queue, binding_keys).await;
        let inbox = consume(&amqp, &consumer_queue).await;
        let name = "delayed".to_string();
        let exchange = unique("intake-ex");
        let queue = unique("intake-q");
        let spec = BusinessSpec {
            name: name.clone(),
            key: unique("test:intake"),
            exchange: target.clone(),
            routing_key: String::new(),
            // `properties` is named so the config writer adds none after the
            // intake table; intake messages carry their producer's anyway.
            extra: format!(
                "properties = \"standard\"\nretry_backoff = \"100ms\"\n{business}\n[businesses.{name}.intake]\nexchange = \"{exchange}\"\nqueue = \"{queue}\"\n{intake}\n"
            ),
        };
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&spec]);
        let ch = amqp.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Intake {
            dir,
            config,
            name,
            key: spec.key,
            target,
            exchange,
            queue,
            consumer_queue,
            amqp,
            ch,
            inbox,
            redis: redis().await,
        }
    }

    /// Starts delayd and waits until it consumes the intake queue.
    async fn start(&self) -> Daemon {
        let d = Daemon::start(&self.config);
        wait_consumed_queue(&self.amqp, &self.queue, &d).await;
        d
    }

    /// Publishes `body` to the intake exchange with `routing_key` and
    /// `props`, and waits for the broker's confirm.
    async fn publish(&self, routing_key: &str, body: &[u8], props: BasicProperties) {
        publish_to(&self.ch, &self.exchange, routing_key, body, props).await;
    }

    /// Publishes `body` with an integer `x-delay` of `ms`.
    async fn publish_delayed(&self, routing_key: &str, body: &[u8], ms: i32) {
        self.publish(routing_key, body, delayed(AMQPValue::LongInt(ms)))
            .await;
    }

    /// Publishes each of `bodies` in turn, due at once.
    async fn publish_now(&self, bodies: &[&[u8]]) {
        for body in bodies {
            self.publish_delayed("", body, 0).await;
        }
    }

    /// The bodies delivered, in order, once `n` have come (within 10 s)
    /// and nothing more has for `quiet`.
    async fn delivered(&self, n: usize, quiet: Duration, d: &Daemon) -> Vec<Vec<u8>> {
        wait_n(&self.inbox, n, Duration::from_secs(10), d).await;
        self.inbox.settle(quiet).await;
        self.inbox.all().into_iter().map(|r| r.body).collect()
    }

    /// Waits for one member in the business's dead set.
    async fn assert_kept_dead(&self, d: &Daemon) {
        let dead = family(&self.key).dead;
        let kept = eventually_zcard(&self.redis, &dead, 1, Duration::from_secs(5)).await;
        assert!(kept, "not in the dead set; log:\n{}", d.tail());
    }

    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let mut all = vec![args[0], "--config", self.config.to_str().unwrap()];
        all.extend_from_slice(&args[1..]);
        delayd(&all)
    }

    /// Like [`Intake::new`], on a direct target bound with the empty key.
    async fn direct(business: &str, intake: &str) -> Self {
        Self::new(ExchangeKind::Direct, &[""], business, intake).await
    }

    /// Like [`Intake::direct`], with delayd started and consuming the intake.
    async fn direct_started(business: &str, intake: &str) -> (Self, Daemon) {
        Self::started(ExchangeKind::Direct, &[""], business, intake).await
    }

    /// Like [`Intake::new`], with delayd started and consuming the intake.
    async fn started(
        kind: ExchangeKind,
        keys: &[&str],
        business: &str,
        intake: &str,
    ) -> (Self, Daemon) {
        let t = Self::new(kind, keys, business, intake).await;
        let d = t.start().await;
        (t, d)
    }

    /// Stops delayd (SIGKILL) and deletes what the test declared and stored.
    async fn stop(self, d: Daemon) {
        drop(d);
        self.cleanup().await;
    }

    async fn cleanup(self) {
        let ch = self.amqp.create_channel().await.unwrap();
        let queues = [self.queue.as_str(), &self.consumer_queue];
        delete_topology(&ch, &queues, &[&self.exchange, &self.target]).await;
        let mut r = self.redis.clone();
        del_family(&mut r, &self.key).await;
        drop(self.dir);
    }
}

/// Declares `target` of `kind` and a durable queue bound to it by each key.
async fn declare_target(
    ch: &Channel,
    target: &str,
    kind: ExchangeKind,
    queue: &str,
    binding_keys: &[&str],
) {
    declare_exchange_kind(ch, target, kind).await;
    declare_queue(ch, queue).await;
    for bk in binding_keys {
        ch.queue_bind(
            queue.into(),
            target.into(),
            (*bk).into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
}

/// A fanout exchange for the intake's dead letters, with a queue bound to
/// it: (a channel, the exchange, the queue).
async fn dead_letter_exchange(amqp: &Connection) -> (Channel, String, String) {
    let ch = amqp.create_channel().await.unwrap();
    let (dlx, dlq) = (unique("dlx"), unique("dlq"));
    declare_target(&ch, &dlx, ExchangeKind::Fanout, &dlq, &[""]).await;
    (ch, dlx, dlq)
}

/// Properties with one `x-delay` header and `delivery_mode = 2`, as the
/// plugin's suite publishes.
async fn publish_to(ch: &Channel, exchange: &str, rk: &str, body: &[u8], props: BasicProperties) {
    let confirm = publish_props(ch, exchange, rk, body, props).await;
    assert_acked(vec![confirm], Duration::from_secs(10)).await;
}

/// A body that says which delay it was published with: the plugin suite's
/// `term_to_binary(V)`.
fn body_of(i: usize, delay: i32) -> Vec<u8> {
    format!("{i}:{delay}").into_bytes()
}

fn delay_in(body: &[u8]) -> i32 {
    let s = std::str::from_utf8(body).unwrap();
    s.split(':').nth(1).unwrap().parse().unwrap()
}

/// The plugin suite's delays (500, 100, 300, 200, 100, 400 ms) times ten.
/// A delay counts from when the message reaches delayd, as in the plugin
/// from when it reaches the exchange, so delay order is arrival order only
/// while the six publishes and their intake take less than the smallest
/// step; 100 ms was not enough on a loaded CI machine (500 before 400).
const SUITE_DELAYS: [i32; 6] = [5000, 1000, 3000, 2000, 1000, 4000];

/// Publishes the suite's delays, waits for every message, and asserts they
/// arrived in delay order, none before its delay.
async fn assert_delivered_in_delay_order(t: &Intake, d: &Daemon, delays: &[i32], as_string: bool) {
    let start = wall_ms();
    for (i, ms) in delays.iter().enumerate() {
        let v = if as_string {
            AMQPValue::LongString(LongString::from(ms.to_string()))
        } else {
            AMQPValue::LongInt(*ms)
        };
        t.publish("", &body_of(i, *ms), delayed(v)).await;
    }
    for r in &assert_delivered_in_delay_order_after(t, d, delays).await {
        let ms = delay_in(&r.body) as i64;
        assert!(
            r.at_ms >= start + ms,
            "a message delayed {ms} ms arrived {} ms after the first publish",
            r.at_ms - start
        );
    }
}

/// `routing_topic`, `routing_direct` and `routing_fanout` of the plugin's
/// suite, with its binding and routing keys and delay 0: each routing key is
/// routed by the target's own type. Where the plugin dropped a message no
/// binding matched, delayd keeps it as unroutable: retried, then dead.
#[tokio::test]
async fn routing_through_topic_direct_and_fanout_targets_as_the_plugin_suite() {
    let cases: [(ExchangeKind, &[&str], &[&str], usize); 3] = [
        (
            ExchangeKind::Topic,
            &["a.b.c", "a.*.c", "a.#"],
            &["a.b.c", "a.z.c", "a.j.k", "b.b.c"],
            3,
        ),
        (
            ExchangeKind::Direct,
            &["mykey"],
            &["mykey", "noroute", "mykey"],
            2,
        ),
        (
            ExchangeKind::Fanout,
            &["mykey", "", "otherkey"],
            &["mykey", "noroute", "mykey"],
            3,
        ),
    ];
    for (kind, bks, rks, count) in cases {
        let (t, d) = Intake::started(kind.clone(), bks, "max_attempts = 1", "").await;
        for (i, rk) in rks.iter().enumerate() {
            t.publish_delayed(rk, &body_of(i, 0), 0).await;
        }
        wait_n(&t.inbox, count, Duration::from_secs(10), &d).await;
        let unroutable = rks.len() - count;
        let dead = family(&t.key).dead;
        let ok =
            eventually_zcard(&t.redis, &dead, unroutable as u64, Duration::from_secs(10)).await;
        assert!(
            ok,
            "{kind:?}: {unroutable} unroutable expected in the dead set"
        );
        t.inbox.settle(Duration::from_millis(500)).await;
        assert_eq!(t.inbox.len(), count, "{kind:?}");
        for m in t.inbox.all() {
            let i: usize = std::str::from_utf8(&m.body)
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                m.routing_key, rks[i],
                "{kind:?}: delivered with its own routing key"
            );
        }
        drop(d);
        t.cleanup().await;
    }
}

/// `delay_order` and `e2e_delay`: the suite's delays 500, 100, 300, 200,
/// 100, 400 ms, scaled as in [`SUITE_DELAYS`], arrive sorted by delay, none
/// early; here through an exchange-to-exchange binding (target → a second
/// direct exchange with the queue), as `e2e_*`.
#[tokio::test]
async fn delays_arrive_in_order_through_an_exchange_to_exchange_binding() {
    let t = Intake::new(ExchangeKind::Direct, &[], "", "").await;
    let ch = t.amqp.create_channel().await.unwrap();
    let second = unique("e2e");
    let queue = unique("e2e-q");
    declare_target(&ch, &second, ExchangeKind::Direct, &queue, &[""]).await;
    ch.exchange_bind(
        second.as_str().into(),
        t.target.as_str().into(),
        "".into(),
        ExchangeBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let e2e = Intake {
        inbox: consume(&t.amqp, &queue).await,
        ..t
    };
    let d = e2e.start().await;
    assert_delivered_in_delay_order(&e2e, &d, &SUITE_DELAYS, false).await;
    // `e2e_nodelay`: no delay at all.
    e2e.publish_delayed("", b"nodelay:0", 0).await;
    wait_n(&e2e.inbox, 7, Duration::from_secs(5), &d).await;
    delete_topology(&ch, &[&queue], &[&second]).await;
    e2e.stop(d).await;
}

/// `string_delay_header`: the delays as strings of digits.
#[tokio::test]
async fn string_delays_are_read_as_the_plugin_reads_them() {
    let (t, d) = Intake::direct_started("", "").await;
    assert_delivered_in_delay_order(&t, &d, &SUITE_DELAYS, true).await;
    t.stop(d).await;
}

/// `delayed_messages_count`: six delayed messages are six members of `K`,
/// one ZCARD, and `delayd inspect` shows them pending.
#[tokio::test]
async fn delayed_messages_are_counted_with_one_zcard() {
    let (t, d) = Intake::direct_started("", "").await;
    let delays = [5000, 2000, 3000, 2000, 3000, 4000];
    for (i, ms) in delays.iter().enumerate() {
        t.publish_delayed("", &body_of(i, *ms), *ms).await;
    }
    let ok = eventually_zcard(&t.redis, &t.key, 6, Duration::from_secs(5)).await;
    assert!(ok, "not stored:\n{}", d.tail());
    let (code, out, err) = t.cli(&["inspect", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["pending"], 6, "{out}");
    assert_delivered_in_delay_order_after(&t, &d, &delays).await;
    t.stop(d).await;
}

/// Waits for messages already published with `delays`, asserts they came
/// in delay order, and returns them.
async fn assert_delivered_in_delay_order_after(
    t: &Intake,
    d: &Daemon,
    delays: &[i32],
) -> Vec<Received> {
    let longest = *delays.iter().max().unwrap() as u64;
    let limit = Duration::from_millis(longest + 10_000);
    wait_n(&t.inbox, delays.len(), limit, d).await;
    let got = t.inbox.all();
    let order: Vec<i32> = got.iter().map(|r| delay_in(&r.body)).collect();
    let mut sorted = delays.to_vec();
    sorted.sort();
    assert_eq!(order, sorted, "delivered out of delay order");
    got
}

/// `node_restart_before_delay_expires`, for delayd: messages stored, delayd
/// stopped before any is due and started again: every one arrives, in order.
/// The delays are 1 s apart and the first 2 s away, as [`SUITE_DELAYS`]: with
/// 500 ms, on a loaded machine the seven publishes outlasted the shortest
/// delay (six stored, one delivered) or a step (delivered out of delay order).
#[tokio::test]
async fn a_restart_of_delayd_before_the_delays_expire_loses_nothing() {
    let (t, mut d) = Intake::direct_started("", "").await;
    let delays = [5000, 7000, 4000, 3000, 8000, 2000, 6000];
    for (i, ms) in delays.iter().enumerate() {
        t.publish_delayed("", &body_of(i, *ms), *ms).await;
    }
    assert!(eventually_zcard(&t.redis, &t.key, 7, Duration::from_secs(5)).await);
    d.signal(15);
    assert!(d.wait(Duration::from_secs(15)).success());
    let d = t.start().await;
    assert_delivered_in_delay_order_after(&t, &d, &delays).await;
    t.inbox.settle(Duration::from_millis(500)).await;
    assert_eq!(t.inbox.len(), 7, "no duplicate after a clean stop");
    t.stop(d).await;
}

/// Every property the producer set, and every header of every field type,
/// arrive as published, with the routing key and a binary body.
#[tokio::test]
async fn properties_and_headers_arrive_as_published() {
    let (t, d) = Intake::started(ExchangeKind::Topic, &["order.#"], "", "").await;
    let mut nested = FieldTable::default();
    nested.insert("n".into(), AMQPValue::ShortShortInt(-3));
    let mut h = FieldTable::default();
    for (k, v) in [
        ("x-delay", AMQPValue::LongInt(300)),
        ("b", AMQPValue::Boolean(true)),
        ("u8", AMQPValue::ShortShortUInt(200)),
        ("i8", AMQPValue::ShortShortInt(-100)),
        ("i16", AMQPValue::ShortInt(-300)),
        ("u16", AMQPValue::ShortUInt(60000)),
        ("i32", AMQPValue::LongInt(-70000)),
        ("u32", AMQPValue::LongUInt(4_000_000_000)),
        ("i64", AMQPValue::LongLongInt(-(1 << 40))),
        ("f", AMQPValue::Float(1.5)),
        ("d", AMQPValue::Double(2.25)),
        (
            "dec",
            AMQPValue::DecimalValue(lapin::types::DecimalValue {
                scale: 2,
                value: 12345,
            }),
        ),
        (
            "s",
            AMQPValue::LongString(LongString::from(b"\x00\xffbin".to_vec())),
        ),
        (
            "arr",
            AMQPValue::FieldArray(vec![AMQPValue::LongInt(1), AMQPValue::Void].into()),
        ),
        ("ts", AMQPValue::Timestamp(1_700_000_000)),
        ("t", AMQPValue::FieldTable(nested)),
        ("x", AMQPValue::ByteArray(vec![1u8, 2, 3].into())),
        ("v", AMQPValue::Void),
    ] {
        h.insert(k.into(), v);
    }
    let props = BasicProperties::default()
        .with_headers(h)
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2)
        .with_content_encoding(ShortString::from("gzip"))
        .with_correlation_id(ShortString::from("corr-1"))
        .with_priority(7)
        .with_expiration(ShortString::from("600000"))
        .with_reply_to(ShortString::from("replies"))
        .with_message_id(ShortString::from(unique("order")))
        .with_timestamp(1_700_000_123)
        .with_type(ShortString::from("order.expired"))
        .with_user_id(ShortString::from("guest"))
        .with_app_id(ShortString::from("shop"));
    let body = b"\x00binary\xff body".to_vec();
    let start = wall_ms();
    t.publish("order.created.eu", &body, props.clone()).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    let got = t.inbox.all().remove(0);
    assert!(got.at_ms >= start + 300, "arrived early");
    assert_eq!(got.body, body);
    assert_eq!(got.routing_key, "order.created.eu");
    assert_eq!(got.properties, props, "properties differ");
    t.stop(d).await;
}

/// A body spanning many frames (RabbitMQ's are 128 KiB) arrives whole and
/// byte-exact.
#[tokio::test]
async fn a_body_larger_than_a_frame_arrives_whole() {
    let (t, d) = Intake::direct_started("", "").await;
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    t.publish_delayed("", &body, 200).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    assert!(t.inbox.all()[0].body == body, "the body differs");
    t.stop(d).await;
}

/// Headers the broker took are delivered, however close to its frame size
/// (a content header travels in one frame): 100 kB of them, more than the
/// 32 KiB frames the intake's connection once asked for (lapin then closed
/// it on every delivery), arrive intact and once, and the intake goes on.
#[tokio::test]
async fn headers_larger_than_a_32_kib_frame_arrive_whole_and_the_intake_goes_on() {
    let (t, d) = Intake::direct_started("", "").await;
    let big: String = (0..100_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut h = FieldTable::default();
    h.insert("x-delay".into(), AMQPValue::LongInt(200));
    h.insert("big".into(), AMQPValue::LongString(big.clone().into()));
    let props = BasicProperties::default()
        .with_headers(h)
        .with_delivery_mode(2);
    t.publish("", b"big-headers", props).await;
    t.publish_delayed("", b"after", 200).await;
    wait_n(&t.inbox, 2, Duration::from_secs(15), &d).await;
    t.inbox.settle(Duration::from_millis(1000)).await;
    let got = t.inbox.all();
    assert_eq!(got.len(), 2, "each once");
    let m = got
        .iter()
        .find(|r| r.body == b"big-headers")
        .expect("the message with big headers");
    let headers = m.properties.headers().clone().unwrap_or_default();
    match headers.inner().get("big") {
        Some(AMQPValue::LongString(v)) => {
            assert!(v.as_bytes() == big.as_bytes(), "the header differs")
        }
        other => panic!("header big arrived as {other:?}"),
    }
    t.stop(d).await;
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

/// Publishes one message with the producer's trace context through an
/// intake business with `business` lines; the headers it arrived with.
async fn traced_through_the_intake(business: &str) -> HashMap<String, AMQPValue> {
    let (t, d) = Intake::started(ExchangeKind::Direct, &["order.timeout"], business, "").await;
    let mut h = FieldTable::default();
    h.insert("x-delay".into(), AMQPValue::LongInt(300));
    for (name, value) in [("traceparent", TRACEPARENT), ("tracestate", TRACESTATE)] {
        h.insert(
            name.into(),
            AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
        );
    }
    let start = wall_ms();
    let props = BasicProperties::default().with_headers(h);
    t.publish("order.timeout", b"{\"order\":42}", props).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    let got = t.inbox.all().remove(0);
    assert!(got.at_ms >= start + 300, "arrived early");
    t.stop(d).await;
    got.headers
}

/// A header's text, panicking unless it is a long string.
fn header_text(h: &HashMap<String, AMQPValue>, name: &str) -> String {
    match h.get(name) {
        Some(AMQPValue::LongString(v)) => String::from_utf8(v.as_bytes().to_vec()).unwrap(),
        other => panic!("{name} arrived as {other:?}"),
    }
}

/// A producer's W3C trace context (`traceparent`, `tracestate`) reaches the
/// consumer through the delay as headers of the same names, byte for byte,
/// so the consumer can link its span to the producer's trace.
#[tokio::test]
async fn a_producers_trace_context_headers_arrive_unchanged_after_the_delay() {
    let h = traced_through_the_intake("").await;
    assert_eq!(header_text(&h, "traceparent"), TRACEPARENT);
    assert_eq!(header_text(&h, "tracestate"), TRACESTATE);
}

/// With `trace = "link"`, an intake message arrives with delayd's own
/// `traceparent` (a new trace, the producer's sampled flag) and the
/// producer's context unchanged under `x-delayd-producer-*`.
#[tokio::test]
async fn with_trace_link_an_intake_message_carries_a_new_trace_and_the_producers_beside_it() {
    let h = traced_through_the_intake("trace = \"link\"").await;
    assert_eq!(
        header_text(&h, "x-delayd-producer-traceparent"),
        TRACEPARENT
    );
    assert_eq!(header_text(&h, "x-delayd-producer-tracestate"), TRACESTATE);
    assert!(!h.contains_key("tracestate"), "the new trace has no state");
    let own = header_text(&h, "traceparent");
    let f: Vec<&str> = own.split('-').collect();
    assert_eq!(f.len(), 4, "{own}");
    assert_eq!(
        (f[0], f[1].len(), f[2].len(), f[3]),
        ("00", 32, 16, "01"),
        "{own}"
    );
    assert_ne!(
        f[1], "0af7651916cd43dd8448eb211c80319c",
        "not a new trace: {own}"
    );
}

/// A non-numeric `x-delay` is published at once, with a warning and a count.
#[tokio::test]
async fn an_invalid_x_delay_is_published_at_once_with_a_warning_and_a_count() {
    let t = Intake::direct("", "").await;
    let port = listen_on_free_port(&t.config, 30000..32700);
    let d = t.start().await;
    let start = wall_ms();
    t.publish(
        "",
        b"soon",
        delayed(AMQPValue::LongString(LongString::from("soon"))),
    )
    .await;
    t.publish("", b"true", delayed(AMQPValue::Boolean(true)))
        .await;
    wait_n(&t.inbox, 2, Duration::from_secs(5), &d).await;
    assert!(
        t.inbox.all().iter().all(|r| r.at_ms - start < 2000),
        "published at once"
    );
    let ok = eventually(Duration::from_secs(5), || async {
        let logs = d.logs();
        logs.contains("the delay header is not a number") && logs.contains("x-delay: the string")
    })
    .await;
    assert!(ok, "no warning:\n{}", d.tail());
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert!(
        metrics.contains("delayd_intake_invalid_delay_total{business=\"delayed\"} 2"),
        "{metrics}"
    );
    t.stop(d).await;
}

/// A target with nothing bound: the message is returned, retried with
/// backoff and then dead, visible in `delayd get` by its message_id.
#[tokio::test]
async fn an_unroutable_target_is_retried_then_dead() {
    let (t, d) = Intake::started(ExchangeKind::Direct, &[], "max_attempts = 2", "").await;
    let id = unique("lost");
    t.publish(
        "nowhere",
        b"unroutable",
        delayed(AMQPValue::LongInt(0)).with_message_id(ShortString::from(id.as_str())),
    )
    .await;
    let dead = family(&t.key).dead;
    let ok = eventually_zcard(&t.redis, &dead, 1, Duration::from_secs(10)).await;
    assert!(ok, "not dead:\n{}", d.tail());
    let (code, out, _) = t.cli(&["get", &t.name, &id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("dead") && out.contains("returned"), "{out}");
    assert!(d
        .logs()
        .contains("publish not delivered; rescheduled with backoff"));
    t.stop(d).await;
}

/// A delay of 60 days is stored like any other: `get` shows it by its
/// message_id, due in 60 days, and `cancel` removes it for good. Ten years
/// is no different.
#[tokio::test]
async fn a_60_day_delay_is_visible_in_get_and_cancellable() {
    let (t, d) = Intake::direct_started("", "").await;
    let id = unique("order-60d");
    let sixty_days: i64 = 60 * 86_400_000;
    let start = wall_ms();
    t.publish(
        "",
        b"in 60 days",
        delayed(AMQPValue::LongLongInt(sixty_days)).with_message_id(ShortString::from(id.as_str())),
    )
    .await;
    t.publish(
        "",
        b"in 10 years",
        delayed(AMQPValue::LongLongInt(10 * 365 * 86_400_000)),
    )
    .await;
    let mut r = t.redis.clone();
    assert!(eventually_zcard(&t.redis, &t.key, 2, Duration::from_secs(5)).await);
    let (code, out, err) = t.cli(&["get", &t.name, &id, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let due = v["due_ms"].as_i64().expect(&out);
    assert_eq!(v["body"], "in 60 days", "{out}");
    assert_eq!(
        v["message"]["properties"]["message_id"],
        id.as_str(),
        "{out}"
    );
    assert_eq!(v["message"]["routing_key"], "", "{out}");
    assert!(
        (due - start - sixty_days).abs() < 5000,
        "due {} ms from now, not 60 days",
        due - start
    );
    let (code, out, _) = t.cli(&["list", &t.name]);
    assert_eq!(code, 0);
    assert!(out.contains(&id), "{out}");
    let (code, out, err) = t.cli(&["cancel", &t.name, &id]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, _) = t.cli(&["get", &t.name, &id]);
    assert_eq!(code, 4, "gone after cancel");
    assert_eq!(zcard(&mut r, &t.key).await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(t.inbox.len(), 0);
    t.stop(d).await;
}

/// Two different messages published with one `message_id` (another body,
/// another delay) are both delivered, as the plugin delivered them; the
/// second is kept under a derived id and counted. An identical re-publish
/// is absorbed (delivered once) and counted too.
#[tokio::test]
async fn a_reused_message_id_never_drops_a_different_message() {
    let t = Intake::direct("", "").await;
    let port = free_port(20000..30000, &[]);
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start_with_env(&t.config, &[("DELAYD_HTTP__LISTEN", listen.as_str())]);
    wait_consumed_queue(&t.amqp, &t.queue, &d).await;
    let id = unique("same");
    let with_id =
        |ms| delayed(AMQPValue::LongInt(ms)).with_message_id(ShortString::from(id.as_str()));
    t.publish("", b"first", with_id(1_500)).await;
    t.publish("", b"second", with_id(300)).await;
    t.publish("", b"second", with_id(300)).await;
    let got = t.delivered(2, Duration::from_millis(700), &d).await;
    assert_eq!(
        got,
        vec![b"second".to_vec(), b"first".to_vec()],
        "both, each at its own time, the identical one once"
    );
    let ids: Vec<Option<String>> = t
        .inbox
        .all()
        .iter()
        .map(|r| r.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    assert_eq!(
        ids,
        vec![Some(id.clone()), Some(id.clone())],
        "both keep the producer's message_id"
    );
    let (_, metrics) = http_get(port, "/metrics").expect("metrics answer");
    for counter in [
        "delayd_intake_id_reused_total{business=\"delayed\"} 1",
        "delayd_intake_absorbed_total{business=\"delayed\"} 1",
    ] {
        assert!(metrics.contains(counter), "{counter} in:\n{metrics}");
    }
    t.stop(d).await;
}

/// With `dedup_window`, a different message reusing the `message_id` of
/// one already delivered is delivered too, as the plugin delivered it,
/// while an identical re-publish of the delivered one is not.
#[tokio::test]
async fn with_a_dedup_window_a_reused_id_is_delivered_and_a_repeat_of_the_delivered_message_is_not()
{
    let t = Intake::direct("dedup_window = \"1h\"", "").await;
    let d = t.start().await;
    let id = unique("reused");
    let with_id = || delayed(AMQPValue::LongInt(0)).with_message_id(ShortString::from(id.as_str()));
    t.publish("", b"first", with_id()).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    t.publish("", b"second", with_id()).await;
    wait_n(&t.inbox, 2, Duration::from_secs(10), &d).await;
    t.publish("", b"first", with_id()).await;
    t.publish("", b"third", with_id()).await;
    let got = t.delivered(3, Duration::from_secs(1), &d).await;
    assert_eq!(
        got,
        vec![b"first".to_vec(), b"second".to_vec(), b"third".to_vec()],
        "each different message once, the repeat of the first not again"
    );
    t.stop(d).await;
}

/// With `dedup_window`, a message delivered under the id delayd derived for
/// it (its id was taken by another message then) is not delivered again
/// when its repeat is stored under the plain id (once that was freed): the
/// delivery is recorded under the one name both carry. In a fresh-clone
/// run at 91eb7b4 the other dedup test delivered a repeat twice this way
/// (the repeat arrived before the ack of the id's previous message).
#[tokio::test]
async fn with_a_dedup_window_a_repeat_is_dropped_whether_stored_under_its_id_or_a_derived_one() {
    let t = Intake::direct("dedup_window = \"1h\"", "").await;
    let d = t.start().await;
    let id = unique("taken");
    let with_id =
        |ms| delayed(AMQPValue::LongInt(ms)).with_message_id(ShortString::from(id.as_str()));
    // "later" holds the id for an hour, so "first" is stored under a
    // derived id and delivered under it.
    t.publish("", b"later", with_id(3_600_000)).await;
    assert!(eventually_zcard(&t.redis, &t.key, 1, Duration::from_secs(5)).await);
    t.publish("", b"first", with_id(0)).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    let (code, _, err) = t.cli(&["cancel", &t.name, &id]);
    assert_eq!(code, 0, "{err}");
    // The id is free again: the repeat is stored under it.
    t.publish("", b"first", with_id(0)).await;
    t.publish("", b"third", with_id(0)).await;
    let got = t.delivered(2, Duration::from_secs(1), &d).await;
    assert_eq!(
        got,
        vec![b"first".to_vec(), b"third".to_vec()],
        "the repeat of the delivered message not again"
    );
    t.stop(d).await;
}

/// A body over a `max_message_size` of 1000.
const TOO_LARGE: [u8; 2000] = [b'x'; 2000];

/// An intake with `max_message_size = 1000` that rejects to `dlx`, with
/// `dlq` bound behind it.
fn too_large_to(dlx: &str, dlq: &str) -> String {
    format!(
        "max_message_size = 1000\ndead_letter_exchange = \"{dlx}\"\ndead_letter_queue = \"{dlq}\""
    )
}

/// A message whose envelope exceeds max_message_size is rejected to the
/// dead-letter exchange delayd set on the intake queue, logged and counted;
/// the messages around it are stored.
#[tokio::test]
async fn a_message_too_large_is_rejected_to_the_intake_dead_letter_exchange() {
    let amqp = amqp_at(&amqp_url()).await;
    let (ch, dlx, dlq) = dead_letter_exchange(&amqp).await;
    let rejected = consume(&amqp, &dlq).await;
    let intake = too_large_to(&dlx, &dlq);
    let (t, d) = Intake::direct_started("", &intake).await;
    t.publish_now(&[b"small-1", &TOO_LARGE, b"small-2"]).await;
    wait_n(&t.inbox, 2, Duration::from_secs(5), &d).await;
    wait_n(&rejected, 1, Duration::from_secs(5), &d).await;
    assert_eq!(rejected.all()[0].body.len(), 2000);
    d.assert_logged("more than max_message_size = 1000");
    delete_topology(&ch, &[&dlq], &[&dlx]).await;
    t.stop(d).await;
}

/// Without a dead-letter exchange, a message over max_message_size is never
/// dropped: it is kept in the business's dead set with its reason, and
/// the messages around it are delivered.
#[tokio::test]
async fn a_message_too_large_without_a_dead_letter_exchange_is_kept_dead() {
    let (t, d) = Intake::direct_started("", "max_message_size = 1000").await;
    t.publish_now(&[b"small-1", &TOO_LARGE, b"small-2"]).await;
    wait_n(&t.inbox, 2, Duration::from_secs(5), &d).await;
    let mut r = t.redis.clone();
    t.assert_kept_dead(&d).await;
    let config = t.config.to_str().unwrap();
    let (code, out, err) = delayd(&["dead", "list", "--config", config, &t.name]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("more than max_message_size = 1000"), "{out}");
    assert_eq!(zcard(&mut r, &t.key).await, 0);
    t.stop(d).await;
}

/// A message that cannot be stored is rejected to the dead-letter exchange
/// only where the intake queue really dead-letters to it: a queue declared
/// before the setting was added has no `x-dead-letter-exchange`, and the
/// broker drops what is rejected from it. It is kept in the business's dead
/// set with its reason instead, and `check` says which.
#[tokio::test]
async fn a_message_too_large_is_kept_dead_when_the_existing_intake_queue_does_not_dead_letter() {
    let amqp = amqp_at(&amqp_url()).await;
    let (ch, dlx, dlq) = dead_letter_exchange(&amqp).await;
    let intake = too_large_to(&dlx, &dlq);
    let t = Intake::direct("", &intake).await;
    // Declared before delayd ever ran, without arguments.
    declare_queue(&ch, &t.queue).await;
    let (code, out, err) = t.cli(&["check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("kept in the dead set") && out.contains("exists with other arguments"),
        "check says where rejected messages go and why:\n{out}"
    );
    let d = t.start().await;
    t.publish_now(&[&TOO_LARGE, b"small"]).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    t.assert_kept_dead(&d).await;
    assert_eq!(queue_depth(&amqp, &dlq).await, 0, "nothing dead-lettered");
    d.assert_logged("kept in the business's dead set, not rejected");
    delete_topology(&ch, &[&dlq], &[&dlx]).await;
    t.stop(d).await;
}

/// With no queue bound behind the dead-letter exchange, a rejected message
/// would be dropped by the broker: it is kept in the dead set.
#[tokio::test]
async fn a_message_too_large_is_kept_dead_when_no_queue_is_known_behind_the_dead_letter_exchange() {
    let dlx = unique("dlx-unbound");
    let intake = format!("max_message_size = 1000\ndead_letter_exchange = \"{dlx}\"");
    let (t, d) = Intake::direct_started("", &intake).await;
    t.publish_now(&[&TOO_LARGE, b"small"]).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    t.assert_kept_dead(&d).await;
    let (code, out, err) = t.cli(&["check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("kept in the dead set (intake.dead_letter_queue is not set"),
        "{out}"
    );
    let ch = t.amqp.create_channel().await.unwrap();
    delete_topology(&ch, &[], &[&dlx]).await;
    t.stop(d).await;
}

/// `delayd_intake_waiting_for_redis` counts each batch waiting for Redis
/// once, and rests at 0 once they are all written.
#[tokio::test]
async fn the_waiting_gauge_counts_every_waiting_batch_and_rests_at_zero_after() {
    let t = Intake::direct("", "batch_size = 5").await;
    let port = listen_on_free_port(&t.config, 30000..32700);
    let gauge = || {
        let (_, m) = http_get(port, "/metrics").unwrap_or_default();
        m.lines()
            .find_map(|l| l.strip_prefix("delayd_intake_waiting_for_redis{business=\"delayed\"} "))
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    // K holds a string: Redis refuses every write (WRONGTYPE) until it goes.
    let mut r = t.redis.clone();
    let _: () = redis::cmd("SET")
        .arg(&t.key)
        .arg("in the way")
        .query_async(&mut r)
        .await
        .unwrap();
    let d = t.start().await;
    for i in 0..40 {
        t.publish_delayed("", format!("w-{i}").as_bytes(), 0).await;
    }
    // Four batches are written at once; each waits.
    let four = eventually(Duration::from_secs(10), || async { gauge() == Some(4) }).await;
    let seen = gauge();
    let _: () = redis::cmd("DEL")
        .arg(&t.key)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(four, "four batches wait, the gauge reads {seen:?}");
    wait_n(&t.inbox, 40, Duration::from_secs(20), &d).await;
    let zero = eventually(Duration::from_secs(5), || async { gauge() == Some(0) }).await;
    assert!(
        zero,
        "after every batch is written the gauge reads {:?}",
        gauge()
    );
    t.stop(d).await;
}

/// A batch spread over two shards whose second shard's write is refused
/// until the stop: the first shard's messages are acknowledged once stored,
/// so the broker hands back only the rest, and messages without a
/// `message_id` (delayd assigns each delivery a new id) are not stored twice.
#[tokio::test]
async fn a_batch_half_stored_at_the_stop_is_handed_back_only_in_its_unstored_half() {
    let t = Intake::direct("shards = 2", "").await;
    let shard1 = format!("{}:1", t.key);
    let mut r = t.redis.clone();
    // Shard 1 holds a string: its writes are refused (WRONGTYPE).
    let _: () = redis::cmd("SET")
        .arg(&shard1)
        .arg("in the way")
        .query_async(&mut r)
        .await
        .unwrap();
    // Published before delayd consumes, so one batch takes them all.
    let d = t.start().await;
    drop(d);
    let bodies: Vec<Vec<u8>> = (0..40).map(|i| format!("half-{i}").into_bytes()).collect();
    for b in &bodies {
        t.publish_delayed("", b, 0).await;
    }
    let d = t.start().await;
    let some = eventually(Duration::from_secs(10), || async {
        !t.inbox.is_empty()
            && d.logs()
                .contains("Redis does not store intake messages now")
    })
    .await;
    assert!(
        some,
        "shard 0 delivers while shard 1 is refused:\n{}",
        d.tail()
    );
    let mut d = d;
    d.signal(15);
    d.wait(Duration::from_secs(30));
    let _: () = redis::cmd("DEL")
        .arg(&shard1)
        .query_async(&mut r)
        .await
        .unwrap();
    let d = t.start().await;
    wait_n(&t.inbox, bodies.len(), Duration::from_secs(20), &d).await;
    t.inbox.settle(Duration::from_secs(1)).await;
    let want: std::collections::HashSet<Vec<u8>> = bodies.into_iter().collect();
    t.inbox
        .assert_each_once(&want, "a stop with half a batch stored");
    for k in [format!("{}:0", t.key), shard1] {
        del_family(&mut r, &k).await;
    }
    t.stop(d).await;
}

/// `kill -9` of delayd while producers publish: every message is delivered,
/// and a message delivered twice is one the broker redelivered (counted by
/// the restarted daemon).
#[tokio::test]
async fn kill_9_mid_intake_loses_nothing() {
    // A short lease, so what the killed process had claimed comes back soon.
    let t = Intake::direct("lease = \"2s\"", "").await;
    // Below the ephemeral range: the restarted instance binds it again.
    let port = listen_on_free_port(&t.config, 25000..26000);
    let mut d = t.start().await;
    let n = 20_000usize;
    let producer = {
        let ch = t.amqp.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let exchange = t.exchange.clone();
        tokio::spawn(async move {
            let mut confirms = Vec::new();
            for i in 0..n {
                let c = ch
                    .basic_publish(
                        exchange.as_str().into(),
                        "".into(),
                        BasicPublishOptions::default(),
                        format!("m{i}").as_bytes(),
                        delayed(AMQPValue::LongInt((i % 7) as i32 * 100)),
                    )
                    .await
                    .unwrap();
                confirms.push(c);
            }
            for c in confirms {
                assert!(c.await.unwrap().is_ack());
            }
        })
    };
    // Kill it mid-flow: once some are delivered, while more arrive.
    wait_n(&t.inbox, 2000, Duration::from_secs(30), &d).await;
    d.kill();
    producer.await.unwrap();
    let d = t.start().await;
    let want: std::collections::HashSet<Vec<u8>> =
        (0..n).map(|i| format!("m{i}").into_bytes()).collect();
    wait_all(&t.inbox, &want, Duration::from_secs(60), &d).await;
    t.inbox.settle(Duration::from_millis(500)).await;
    let duplicates = t.inbox.len() - n;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    let counter = |name: &str| business_counter(&metrics, name);
    // Two ways to a duplicate after a crash, both counted: an intake
    // delivery written but not acked (redelivered by the broker), and a
    // member published but not acked in Redis (recovered after its lease).
    let redelivered = counter("delayd_intake_redelivered_total");
    let recovered = counter("delayd_recovered_total");
    assert!(
        duplicates <= redelivered + recovered,
        "{duplicates} duplicates, but only {redelivered} redelivered intake messages and {recovered} recovered leases"
    );
    eprintln!("kill -9 mid-intake: {duplicates} duplicates of {n}; {redelivered} redelivered, {recovered} recovered");
    t.stop(d).await;
}

/// A quorum intake queue (`queue_type = "quorum"`) loses nothing under a
/// `kill -9`, and the messages it redelivers reach consumers without the
/// `x-delivery-count` a quorum queue adds (on RabbitMQ 4, to every
/// redelivery): that count is the intake queue's, not the consumer's.
#[tokio::test]
async fn a_quorum_intake_queue_loses_nothing_under_kill_9_and_passes_on_no_delivery_count() {
    let t = Intake::direct("lease = \"2s\"", "queue_type = \"quorum\"").await;
    // Below the ephemeral range: the restarted instance binds it again.
    let port = listen_on_free_port(&t.config, 25000..26000);
    // A Redis of its own: the pause below stops every writer of a server,
    // and the other tests' must go on.
    let redis_server = PrivateRedis::started(t.dir.path());
    let config = std::fs::read_to_string(&t.config)
        .unwrap()
        .replace(&redis_url(), &redis_server.url());
    std::fs::write(&t.config, config).unwrap();
    let private = redis_at(&redis_server.url()).await;
    let mut d = t.start().await;
    let n = 20_000usize;
    let mut confirms = Vec::new();
    for i in 0..n {
        let c =
            t.ch.basic_publish(
                t.exchange.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                format!("q{i}").as_bytes(),
                delayed(AMQPValue::LongInt(0)),
            )
            .await
            .unwrap();
        confirms.push(c);
        if i == n / 10 {
            // From here Redis takes no writes, so what delayd takes in
            // stays unacked until the kill.
            client_pause(&private, &["PAUSE", "20000", "WRITE"]).await;
        }
        if i == n / 5 {
            // Kill it once it holds some of what came since, unacked (or a
            // full prefetch window of what came before, when it lags: the
            // redelivery count below says which held anything).
            let since = (n / 5 - n / 10) as u32;
            eventually(Duration::from_secs(5), || async {
                queue_depth(&t.amqp, &t.queue).await < since
            })
            .await;
            d.kill();
            client_pause(&private, &["UNPAUSE"]).await;
        }
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    wait_unconsumed_queue(&t.amqp, &t.queue).await;
    let d = t.start().await;
    let want: std::collections::HashSet<Vec<u8>> =
        (0..n).map(|i| format!("q{i}").into_bytes()).collect();
    wait_all(&t.inbox, &want, Duration::from_secs(60), &d).await;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    let redelivered = business_counter(&metrics, "delayd_intake_redelivered_total");
    eprintln!("quorum intake, kill -9: {redelivered} redelivered");
    assert!(redelivered > 0, "the kill left nothing to redeliver");
    let counted: Vec<_> = t
        .inbox
        .all()
        .into_iter()
        .filter(|r| r.headers.contains_key("x-delivery-count"))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert!(
        counted.is_empty(),
        "{} of {n} delivered with the intake queue's x-delivery-count ({redelivered} redelivered), e.g. {:?}",
        counted.len(),
        &counted[..counted.len().min(3)]
    );
    drop(d);
    t.cleanup().await;
}

/// Counter `name` of the business "delayed" in a `/metrics` page (0 when
/// it has not been counted yet).
fn business_counter(metrics: &str, name: &str) -> usize {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{business=\"delayed\"}}")))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `CLIENT args`, on the test's own connection.
async fn client_pause(redis: &redis::aio::MultiplexedConnection, args: &[&str]) {
    let mut r = redis.clone();
    let _: () = redis::cmd("CLIENT")
        .arg(args)
        .query_async(&mut r)
        .await
        .unwrap();
}

/// A quorum queue counts every hand-back of a delivery, a closed channel or
/// connection included, and RabbitMQ 4 drops a message handed back more
/// than 20 times (its default `delivery-limit`). delayd hands its deliveries
/// back whenever it stops before Redis has taken them: a Redis that refuses
/// writes for long, across restarts of delayd (a crash loop, a rolling
/// deploy), must not cost the messages waiting in the intake queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_intake_message_handed_back_more_than_20_times_is_still_delivered() {
    let t = Intake::direct("", "queue_type = \"quorum\"").await;
    // A Redis of its own: the test makes it refuse every write.
    let redis_server = tokio::task::block_in_place(|| PrivateRedis::started(t.dir.path()));
    let config = std::fs::read_to_string(&t.config)
        .unwrap()
        .replace(&redis_url(), &redis_server.url());
    std::fs::write(&t.config, config).unwrap();
    let mut private = redis_server.conn().await;
    let mut d = t.start().await;
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = query(&mut private, "CONFIG", ("SET", k, v)).await;
    }
    let want: std::collections::HashSet<Vec<u8>> =
        (0..5).map(|i| format!("back-{i}").into_bytes()).collect();
    for body in &want {
        t.publish_delayed("", body, 0).await;
    }
    let rounds = 22;
    for round in 0..rounds {
        // delayd holds all five, unacked, and cannot store them.
        let held = eventually(Duration::from_secs(20), || async {
            queue_depth(&t.amqp, &t.queue).await == 0
        })
        .await;
        assert!(
            held,
            "round {round}: delayd never took the messages in; log:\n{}",
            d.tail()
        );
        d.kill();
        wait_unconsumed_queue(&t.amqp, &t.queue).await;
        let back = eventually(Duration::from_secs(10), || async {
            queue_depth(&t.amqp, &t.queue).await == want.len() as u32
        })
        .await;
        assert!(
            back,
            "after {} hand-backs the intake queue holds {} of {} messages",
            round + 1,
            queue_depth(&t.amqp, &t.queue).await,
            want.len()
        );
        d = t.start().await;
    }
    let _: () = query(&mut private, "CONFIG", ("SET", "maxmemory", "0")).await;
    wait_all(&t.inbox, &want, Duration::from_secs(30), &d).await;
    drop(d);
    t.cleanup().await;
}

/// `delayd check` reports the intake's exchange and queue (missing ones are
/// declared by `run`, existing ones are counted), and refuses an intake
/// exchange that would not pass every routing key to the queue.
#[tokio::test]
async fn check_reports_the_intake_topology_and_refuses_a_direct_intake_exchange() {
    let t = Intake::direct("", "").await;
    let (code, out, err) = t.cli(&["check"]);
    assert_eq!(code, 0, "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("intake"))
        .unwrap_or_else(|| panic!("no intake line:\n{out}"));
    assert!(line.contains("missing (delayd run declares it"), "{line}");
    let d = t.start().await;
    t.publish("", b"waits", delayed(AMQPValue::LongInt(60_000)))
        .await;
    drop(d);
    let (code, out, _) = t.cli(&["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "ok, exchange \"{}\" (fanout) -> queue \"{}\"",
            t.exchange, t.queue
        )),
        "{out}"
    );
    // A direct exchange under the intake name: "#" would route nothing.
    let ch = t.amqp.create_channel().await.unwrap();
    ch.exchange_delete(t.exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    declare_exchange_kind(&ch, &t.exchange, ExchangeKind::Direct).await;
    let f = assert_check_fails(&t.config);
    assert!(
        f.line.contains("intake exchange") && f.line.contains("is direct"),
        "{}",
        f.line
    );
    t.cleanup().await;
}

/// `run` refuses to start on an intake exchange that exists with another
/// type than fanout (a direct exchange routes nothing to the "#" binding;
/// the plugin's own exchange would deliver every message a second time),
/// with the line `check` prints; it consumes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_an_intake_exchange_that_is_not_fanout() {
    let t = Intake::direct("", "").await;
    let ch = t.amqp.create_channel().await.unwrap();
    declare_exchange_kind(&ch, &t.exchange, ExchangeKind::Direct).await;
    let mut d = Daemon::start(&t.config);
    let status = tokio::task::block_in_place(|| d.wait(Duration::from_secs(30)));
    assert_eq!(status.code(), Some(2), "{}", d.logs());
    let logs = d.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("intake exchange"))
        .unwrap_or_else(|| panic!("no line about the intake exchange:\n{logs}"));
    assert!(
        line.contains(&format!("\"{}\" is direct, not fanout", t.exchange))
            && line.contains("delete it"),
        "{line}"
    );
    assert!(!logs.contains("consuming the intake queue"), "{logs}");
    let f = assert_check_fails(&t.config);
    assert!(f.line.contains("is direct, not fanout"), "{}", f.line);
    t.cleanup().await;
}

/// `replica_ack = "fsynced"` asks for WAITAOF, which Redis has from 7.2 (and
/// Valkey from its first release). Where Redis lacks it every intake write
/// would fail and be retried for ever, so `run` refuses to start (exit 2)
/// and `check` fails, each with one line naming the setting and the remedy;
/// where Redis has it, `check` passes. (What the wait does on a replica is
/// in `tests/redis_sentinel.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsynced_is_refused_with_one_line_where_redis_lacks_waitaof() {
    let t = Intake::direct("", "replicas = 1\nreplica_ack = \"fsynced\"").await;
    let wanted = "intake.replica_ack = \"fsynced\" needs WAITAOF";
    if has_waitaof(&mut t.redis.clone()).await {
        let (code, out, err) = t.cli(&["check"]);
        assert_eq!(
            code, 0,
            "check refused fsynced where Redis has WAITAOF:\n{out}{err}"
        );
        assert!(!out.contains(wanted), "{out}");
        t.cleanup().await;
        return;
    }
    let f = assert_check_fails(&t.config);
    assert!(
        f.line.contains(wanted) && f.line.contains("replica_ack = \"received\""),
        "{}",
        f.line
    );
    let mut d = Daemon::start(&t.config);
    let status = tokio::task::block_in_place(|| d.wait(Duration::from_secs(30)));
    let logs = d.logs();
    assert_eq!(status.code(), Some(2), "{logs}");
    assert_eq!(logs.matches("needs WAITAOF").count(), 1, "{logs}");
    assert!(!logs.contains("consuming the intake queue"), "{logs}");
    t.cleanup().await;
}

/// The migration guide's steps on a real broker (the plugin itself is not
/// installed here, so its exchange is a stand-in topic exchange bound like
/// the plugin's): target declared and bound with the old binding key,
/// delayd on a second intake name, producers moved there, the old exchange
/// deleted, then the old name taken back by the intake. Every message
/// published along the way arrives once, with its routing key.
#[tokio::test]
async fn the_migration_guide_steps_lose_nothing() {
    let amqp = amqp_at(&amqp_url()).await;
    let admin = amqp.create_channel().await.unwrap();
    let old = unique("orders.delayed");
    let target = unique("orders");
    let consumer_queue = unique("order-timeouts");
    // Before: the consumers' queue bound to the delayed exchange.
    declare_target(
        &admin,
        &old,
        ExchangeKind::Topic,
        &consumer_queue,
        &["order.*.timeout"],
    )
    .await;
    let inbox = consume(&amqp, &consumer_queue).await;
    // Step 1: the target, with the same binding key.
    declare_target(
        &admin,
        &target,
        ExchangeKind::Topic,
        &consumer_queue,
        &["order.*.timeout"],
    )
    .await;
    // Step 2: delayd with the intake under a new name.
    let v2 = format!("{old}.v2");
    let queue = unique("delayd.intake.orders");
    let key = unique("test:migrate");
    let spec = |intake: &str| {
        BusinessSpec {
        name: "orders".into(),
        key: key.clone(),
        exchange: target.clone(),
        routing_key: String::new(),
        extra: format!(
            "properties = \"standard\"\n[businesses.orders.intake]\nexchange = \"{intake}\"\nqueue = \"{queue}\"\n"
        ),
    }
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&spec(&v2)]);
    let d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &queue, &d).await;
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // Step 3: producers publish to the new name, unchanged otherwise.
    let in_300ms = || delayed(AMQPValue::LongInt(300));
    let ch = amqp.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_to(&ch, &v2, "order.42.timeout", b"via v2", in_300ms()).await;
    // Meanwhile the old exchange still delivers what it held.
    publish_to(
        &ch,
        &old,
        "order.41.timeout",
        b"held by the plugin",
        BasicProperties::default(),
    )
    .await;
    wait_n(&inbox, 2, Duration::from_secs(10), &d).await;
    // Steps 4-5: the old exchange is empty and deleted.
    admin
        .exchange_delete(old.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    // Step 6: the intake takes the old name back. The killed instance's
    // consumer must be gone first, or the wait below could see it and
    // publish before the new one has declared the old name.
    drop(d);
    wait_unconsumed_queue(&amqp, &queue).await;
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&spec(&old)]);
    let d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &queue, &d).await;
    publish_to(&ch, &old, "order.43.timeout", b"old name again", in_300ms()).await;
    publish_to(&ch, &v2, "order.44.timeout", b"v2 still", in_300ms()).await;
    wait_n(&inbox, 4, Duration::from_secs(10), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    let mut got: Vec<(String, Vec<u8>)> = inbox
        .all()
        .into_iter()
        .map(|r| (r.routing_key, r.body))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                "order.41.timeout".to_string(),
                b"held by the plugin".to_vec()
            ),
            ("order.42.timeout".to_string(), b"via v2".to_vec()),
            ("order.43.timeout".to_string(), b"old name again".to_vec()),
            ("order.44.timeout".to_string(), b"v2 still".to_vec()),
        ]
    );
    drop(d);
    delete_topology(&admin, &[&queue, &consumer_queue], &[&old, &v2, &target]).await;
    del_family(&mut redis().await, &key).await;
}

/// A message lapin cannot read (a header key, a short-string property or a
/// routing key that is not UTF-8, which RabbitMQ passes on) goes
/// to the intake's dead-letter exchange as published, with a reason in the
/// log; the intake keeps its connection and delivers what follows.
#[tokio::test]
async fn a_message_lapin_cannot_parse_is_dead_lettered_and_the_intake_moves_on() {
    let amqp = amqp_at(&amqp_url()).await;
    let (ch, dlx, dlq) = dead_letter_exchange(&amqp).await;
    let intake = format!("dead_letter_exchange = \"{dlx}\"\ndead_letter_queue = \"{dlq}\"");
    let (t, d) = Intake::direct_started("", &intake).await;
    let mut raw = RawAmqp::connect(&amqp_url()).await;
    let bad_key = Table::default()
        .field(b"x-delay", b'I', &0i32.to_be_bytes())
        .field(b"tenant-\xff", b'S', &long_bytes(b"eu"));
    let bad_key = RawProps {
        headers: Some(bad_key),
        delivery_mode: Some(2),
        ..Default::default()
    };
    raw.publish(&t.exchange, b"", &bad_key.encode(), b"bad key")
        .await;
    let bad_type = RawProps {
        content_type: Some(b"text/\xc3(".to_vec()),
        ..Default::default()
    };
    raw.publish(&t.exchange, b"", &bad_type.encode(), b"bad content_type")
        .await;
    raw.publish(
        &t.exchange,
        b"eu.\xff",
        &RawProps::default().encode(),
        b"bad routing key",
    )
    .await;
    t.publish_delayed("", b"after", 0).await;
    wait_n(&t.inbox, 1, Duration::from_secs(10), &d).await;
    assert_eq!(t.inbox.all()[0].body, b"after");

    let first = raw.get_within(&dlq, Duration::from_secs(10)).await;
    assert_eq!(first.body, b"bad key");
    let headers = headers_of(&first.properties).expect("headers");
    assert!(
        headers
            .iter()
            .any(|f| f.key == b"tenant-\xff" && f.value == long_bytes(b"eu")),
        "the key is dead-lettered as published: {headers:?}"
    );
    let second = raw.get_within(&dlq, Duration::from_secs(10)).await;
    assert_eq!(second.body, b"bad content_type");
    assert_eq!(
        &second.properties[2..10],
        b"\x07text/\xc3(",
        "content_type as published"
    );
    let third = raw.get_within(&dlq, Duration::from_secs(10)).await;
    assert_eq!(
        (third.body.as_slice(), third.routing_key.as_slice()),
        (&b"bad routing key"[..], &b"eu.\xff"[..])
    );
    let logs = d.logs();
    // Each reason names the field, its bytes escaped (and quoted again by
    // the log line).
    for reason in [
        r#"reason="unreadable" detail="lapin cannot read it: header key \"tenant-\\xff\" is not UTF-8""#,
        r#"detail="lapin cannot read it: content_type \"text/\\xc3(\" is not UTF-8""#,
        r#"detail="lapin cannot read it: routing_key \"eu.\\xff\" is not UTF-8""#,
    ] {
        assert!(logs.contains(reason), "{reason}:\n{}", d.tail());
    }
    assert_eq!(
        logs.matches("consuming the intake queue").count(),
        1,
        "the intake kept its channel:\n{}",
        d.tail()
    );
    delete_topology(&ch, &[&dlq], &[&dlx]).await;
    t.stop(d).await;
}

/// What a 0-9-1 consumer receives of a message published through the
/// intake, next to what RabbitMQ delivers of the same publish through a
/// plain exchange, both read as bytes.
struct BothWays {
    t: Intake,
    d: Daemon,
    raw: RawAmqp,
    plain: String,
    plain_queue: String,
    /// A second queue on the target, read as bytes (the inbox's consumer
    /// would take the message from the first).
    target_queue: String,
}

impl BothWays {
    async fn new() -> Self {
        let t = Intake::direct("", "").await;
        let ch = t.amqp.create_channel().await.unwrap();
        let plain = unique("plain");
        let plain_queue = unique("plain-q");
        declare_target(&ch, &plain, ExchangeKind::Direct, &plain_queue, &[""]).await;
        let target_queue = unique("target-raw");
        declare_target(&ch, &t.target, ExchangeKind::Direct, &target_queue, &[""]).await;
        let d = t.start().await;
        let raw = RawAmqp::connect(&amqp_url()).await;
        BothWays {
            t,
            d,
            raw,
            plain,
            plain_queue,
            target_queue,
        }
    }

    /// Publishes `headers` (with `x-delay: 0` first) both ways; returns the
    /// property bytes delivered through delayd and through RabbitMQ alone.
    async fn publish(&mut self, headers: Table) -> (Vec<u8>, Vec<u8>) {
        let mut table = Table::default().field(b"x-delay", b'I', &0i32.to_be_bytes());
        table.0.extend_from_slice(&headers.0);
        let props = RawProps {
            headers: Some(table),
            delivery_mode: Some(2),
            ..Default::default()
        }
        .encode();
        let (plain, delayed) = self.publish_both(&props, b"typed").await;
        assert_eq!(delayed.body, b"typed");
        (delayed.properties, plain.properties)
    }

    /// Publishes encoded `props` and `body` to the plain exchange and to the
    /// intake; returns what RabbitMQ alone delivered and what delayd did.
    async fn publish_both(&mut self, props: &[u8], body: &[u8]) -> (RawMessage, RawMessage) {
        self.raw.publish(&self.plain, b"", props, body).await;
        self.raw.publish(&self.t.exchange, b"", props, body).await;
        let plain = self
            .raw
            .get_within(&self.plain_queue, Duration::from_secs(5));
        let plain = plain.await;
        let delayed = self
            .raw
            .get_within(&self.target_queue, Duration::from_secs(10));
        (plain, delayed.await)
    }

    async fn cleanup(self) {
        let ch = self.t.amqp.create_channel().await.unwrap();
        let queues = [self.plain_queue.as_str(), &self.target_queue];
        delete_topology(&ch, &queues, &[&self.plain]).await;
        drop(self.d);
        self.t.cleanup().await;
    }
}

/// What RabbitMQ alone delivered: the reference the intake is held to.
struct Reference {
    /// The broker's major version: RabbitMQ 4 re-encodes a header table
    /// it routes (keys sorted, one entry a key, booleans as 0 or 1, `L` as
    /// `l`, in arrays too), where RabbitMQ 3 passes it through as published.
    rabbitmq: u32,
    headers: Vec<Field>,
}

/// Publishes `fields` both ways and asserts the intake delivers what
/// RabbitMQ does, changed only as [`as_the_intake_delivers`] says; returns
/// what RabbitMQ delivered, for the test to check that what it meant to
/// exercise reached the broker's own consumers as the version promises.
async fn assert_header_types(fields: Table) -> Reference {
    let mut b = BothWays::new().await;
    let (delayed, plain) = b.publish(fields).await;
    let plain_headers = headers_of(&plain).expect("RabbitMQ delivered headers");
    let delayed_headers = headers_of(&delayed).expect("delayd delivered headers");
    assert_eq!(
        delayed_headers,
        as_the_intake_delivers(&plain_headers),
        "headers through the intake"
    );
    let rabbitmq = b.raw.rabbitmq_major();
    b.cleanup().await;
    Reference {
        rabbitmq,
        headers: plain_headers,
    }
}

/// The type code RabbitMQ delivers for a published `L` (unsigned 64-bit),
/// which 0-9-1 does not define: RabbitMQ 4 sends it as `l`.
fn unsigned_64_as_delivered_by(rabbitmq: u32) -> u8 {
    if rabbitmq >= 4 {
        b'l'
    } else {
        b'L'
    }
}

fn field(key: &str, kind: u8, value: &[u8]) -> Field {
    Field {
        key: key.as_bytes().to_vec(),
        kind,
        value: value.to_vec(),
    }
}

#[tokio::test]
async fn header_type_long_string_arrives_byte_for_byte() {
    let got = assert_header_types(
        Table::default()
            .field(b"empty", b'S', &long_bytes(b""))
            .field(b"text", b'S', &long_bytes("hé ✓".as_bytes()))
            .field(b"binary", b'S', &long_bytes(b"\x00\xff\xfe")),
    )
    .await;
    assert!(got
        .headers
        .contains(&field("binary", b'S', &long_bytes(b"\x00\xff\xfe"))));
}

/// Short strings are the properties and the header keys (0-9-1 has no
/// short-string header value: RabbitMQ reads `s` as a 16-bit integer).
#[tokio::test]
async fn short_string_properties_and_keys_arrive_byte_for_byte() {
    let mut b = BothWays::new().await;
    let long_key = "k".repeat(255);
    let mut headers: [(&[u8], u8, &[u8]); 3] = [
        (b"x-delay", b'I', &[0; 4]),
        (long_key.as_bytes(), b'V', b""),
        ("clé".as_bytes(), b'V', b""),
    ];
    let table = |fields: &[(&[u8], u8, &[u8])]| {
        fields
            .iter()
            .fold(Table::default(), |t, (k, kind, v)| t.field(k, *kind, v))
    };
    let published = RawProps {
        content_type: Some(b"application/json".to_vec()),
        content_encoding: Some(b"".to_vec()),
        headers: Some(table(&headers)),
        delivery_mode: Some(2),
        priority: Some(9),
        correlation_id: Some("é".repeat(127).into_bytes()),
        reply_to: Some(b"replies".to_vec()),
        expiration: Some(b"600000".to_vec()),
        message_id: Some(unique("id").into_bytes()),
        timestamp: Some(u64::MAX),
        kind: Some(b"t".to_vec()),
        user_id: Some(b"guest".to_vec()),
        app_id: Some(b"shop".to_vec()),
    };
    let props = published.encode();
    let (plain, delayed) = b.publish_both(&props, b"x").await;
    let as_rabbitmq_delivers = if b.raw.rabbitmq_major() >= 4 {
        headers.sort_by_key(|f| f.0);
        RawProps {
            headers: Some(table(&headers)),
            ..published
        }
        .encode()
    } else {
        props.clone()
    };
    assert_eq!(
        plain.properties, as_rabbitmq_delivers,
        "RabbitMQ 3 delivers them as published, RabbitMQ 4 with the header keys sorted"
    );
    let sorted = as_the_intake_delivers(&headers_of(&plain.properties).unwrap());
    assert_eq!(headers_of(&delayed.properties).unwrap(), sorted);
    let without_headers = |p: &[u8]| {
        let mut p = p.to_vec();
        // Flags, content_type (16 bytes), an empty content_encoding.
        let at = 2 + 1 + 16 + 1;
        let len = u32::from_be_bytes(p[at..at + 4].try_into().unwrap()) as usize;
        p.drain(at..at + 4 + len);
        p
    };
    assert_eq!(
        without_headers(&delayed.properties),
        without_headers(&props),
        "every other property byte for byte"
    );
    b.cleanup().await;
}

/// One test per header type, each named for what it guarantees: the
/// fields, published both ways, arrive as [`assert_header_types`] says.
macro_rules! header_type_tests {
    ($($(#[$doc:meta])* $name:ident: $($key:literal $code:literal $bytes:expr),+;)*) => {$(
        $(#[$doc])*
        #[tokio::test]
        async fn $name() {
            assert_header_types(Table::default()$(.field($key, $code, &$bytes))+).await;
        }
    )*};
}

header_type_tests! {
    header_type_signed_8_bit_arrives_byte_for_byte: b"min" b'b' [0x80], b"max" b'b' [0x7f];
    header_type_unsigned_8_bit_arrives_byte_for_byte: b"max" b'B' [0xff];
    /// RabbitMQ's code `s` (the spec's `U`, which RabbitMQ 3.10 refuses).
    header_type_signed_16_bit_arrives_byte_for_byte: b"min" b's' i16::MIN.to_be_bytes();
    header_type_unsigned_16_bit_arrives_byte_for_byte: b"max" b'u' u16::MAX.to_be_bytes();
    header_type_signed_32_bit_arrives_byte_for_byte: b"min" b'I' i32::MIN.to_be_bytes();
    header_type_unsigned_32_bit_arrives_byte_for_byte: b"max" b'i' u32::MAX.to_be_bytes();
    header_type_signed_64_bit_arrives_byte_for_byte: b"min" b'l' i64::MIN.to_be_bytes();
    header_type_float_arrives_byte_for_byte:
        b"half" b'f' 1.5f32.to_be_bytes(),
        b"negative-zero" b'f' (-0.0f32).to_be_bytes(),
        b"max" b'f' f32::MAX.to_be_bytes();
    header_type_double_arrives_byte_for_byte:
        b"quarter" b'd' 2.25f64.to_be_bytes(),
        b"huge" b'd' 1e300f64.to_be_bytes();
    header_type_decimal_arrives_byte_for_byte:
        b"price" b'D' [2, 0, 0, 0x30, 0x39],
        b"max" b'D' [255, 0xff, 0xff, 0xff, 0xff];
    header_type_timestamp_arrives_byte_for_byte: b"at" b'T' 1_700_000_000u64.to_be_bytes();
    header_type_byte_array_arrives_byte_for_byte: b"bytes" b'x' long_bytes(b"\x00\x01\xff");
    header_type_void_arrives_byte_for_byte: b"nothing" b'V' [0u8; 0];
}

/// `L` (unsigned 64-bit in the spec) is read as signed and sent as `l`:
/// the same eight bytes, which a consumer reads as negative from 2^63 up.
#[tokio::test]
async fn header_type_unsigned_64_bit_arrives_as_signed_l() {
    let got =
        assert_header_types(Table::default().field(b"max", b'L', &u64::MAX.to_be_bytes())).await;
    let kind = unsigned_64_as_delivered_by(got.rabbitmq);
    assert!(
        got.headers
            .contains(&field("max", kind, &u64::MAX.to_be_bytes())),
        "{:?}",
        got.headers
    );
}

/// A boolean other than 0 or 1 arrives as 1.
#[tokio::test]
async fn header_type_boolean_arrives_as_0_or_1() {
    let got = assert_header_types(
        Table::default()
            .field(b"no", b't', &[0])
            .field(b"yes", b't', &[1])
            .field(b"two", b't', &[2]),
    )
    .await;
    // RabbitMQ 3 passes a 2 through; RabbitMQ 4 decodes it as true.
    let two = if got.rabbitmq >= 4 { 1 } else { 2 };
    assert!(
        got.headers.contains(&field("two", b't', &[two])),
        "{:?}",
        got.headers
    );
}

/// A nested table's keys are sorted too, and its duplicates collapse.
#[tokio::test]
async fn header_type_nested_table_arrives_sorted() {
    let inner = Table::default()
        .field(b"z", b'I', &1i32.to_be_bytes())
        .field(b"a", b's', &2i16.to_be_bytes())
        .field(b"z", b'I', &3i32.to_be_bytes());
    let got = assert_header_types(Table::default().field(b"t", b'F', &inner.as_value())).await;
    assert!(
        got.headers.contains(&field("t", b'F', &inner.as_value())),
        "{:?}",
        got.headers
    );
}

/// An array keeps its order and its repeated values.
#[tokio::test]
async fn header_type_array_arrives_in_order() {
    let items = |unsigned_64: u8| {
        let mut items = Vec::new();
        for (k, v) in [
            (b'I', 2i32.to_be_bytes().to_vec()),
            (b'I', 1i32.to_be_bytes().to_vec()),
            (b'I', 1i32.to_be_bytes().to_vec()),
            (b'S', long_bytes(b"s")),
            (b'V', vec![]),
            (unsigned_64, 7u64.to_be_bytes().to_vec()),
        ] {
            items.push(k);
            items.extend_from_slice(&v);
        }
        long_bytes(&items)
    };
    let got = assert_header_types(Table::default().field(b"a", b'A', &items(b'L'))).await;
    let delivered = items(unsigned_64_as_delivered_by(got.rabbitmq));
    assert!(
        got.headers.contains(&field("a", b'A', &delivered)),
        "{:?}",
        got.headers
    );
}

/// Header order is not kept (keys arrive sorted), and of two entries with
/// one key only one arrives: the last on RabbitMQ 3, which delivers the
/// table as published (the intake sorts it and keeps the last); the first
/// on RabbitMQ 4, which sorts it itself before the intake sees it. Either
/// way a consumer gets from delayd what the broker alone would give it.
#[tokio::test]
async fn headers_arrive_sorted_with_one_value_a_key_as_the_broker_keeps_it() {
    let got = assert_header_types(
        Table::default()
            .field(b"zeta", b'I', &1i32.to_be_bytes())
            .field(b"alpha", b'I', &2i32.to_be_bytes())
            .field(b"zeta", b'I', &3i32.to_be_bytes()),
    )
    .await;
    let entries: Vec<(&[u8], &[u8])> = got
        .headers
        .iter()
        .map(|f| (f.key.as_slice(), f.value.as_slice()))
        .collect();
    let (zero, one, two, three) = (
        &0i32.to_be_bytes()[..],
        &1i32.to_be_bytes()[..],
        &2i32.to_be_bytes()[..],
        &3i32.to_be_bytes()[..],
    );
    if got.rabbitmq >= 4 {
        assert_eq!(
            entries,
            [(&b"alpha"[..], two), (b"x-delay", zero), (b"zeta", one)],
            "RabbitMQ 4 delivers them sorted, the first of a key kept"
        );
    } else {
        assert_eq!(
            entries,
            [
                (&b"x-delay"[..], zero),
                (b"zeta", one),
                (b"alpha", two),
                (b"zeta", three)
            ],
            "RabbitMQ 3 delivers them as published"
        );
    }
}

/// An `x-delay` beyond any plausible delay, a `1e300` double or a
/// 400-digit string, is due at the latest time delayd stores (an infinite
/// double means the same, but RabbitMQ 3.10 refuses to route one: a unit
/// test in `src/intake/delay.rs` covers it); `-1e300` is due at once.
#[tokio::test]
async fn an_x_delay_of_1e300_is_due_at_the_latest_time() {
    let (t, d) = Intake::direct_started("", "").await;
    let double = unique("double");
    let digits = unique("digits");
    for (id, v) in [
        (&double, AMQPValue::Double(1e300)),
        (
            &digits,
            AMQPValue::LongString(LongString::from("9".repeat(400))),
        ),
    ] {
        t.publish(
            "",
            id.as_bytes(),
            delayed(v).with_message_id(ShortString::from(id.as_str())),
        )
        .await;
    }
    t.publish("", b"now", delayed(AMQPValue::Double(-1e300)))
        .await;
    wait_n(&t.inbox, 1, Duration::from_secs(5), &d).await;
    assert_eq!(t.inbox.all()[0].body, b"now");
    let mut r = t.redis.clone();
    for id in [&double, &digits] {
        let score: Option<f64> = zscore(&mut r, &t.key, id).await;
        assert_eq!(
            score,
            Some(delayd::intake::delay::LATEST_MS as f64),
            "{id}:\n{}",
            d.tail()
        );
    }
    t.stop(d).await;
}

/// A business with tenants whose intake reads the tenant from `x-tenant`.
const TENANT_HEADER: &str = "tenant_header = \"x-tenant\"";

/// Properties for an intake message of `tenant` (none: no header) due
/// `delay` ms after it is stored, with `id` as its `message_id`.
fn of_tenant(tenant: Option<AMQPValue>, delay: i32, id: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert("x-delay".into(), AMQPValue::LongInt(delay));
    if let Some(t) = tenant {
        h.insert("x-tenant".into(), t);
    }
    BasicProperties::default()
        .with_headers(h)
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(id))
}

fn text(s: &str) -> Option<AMQPValue> {
    Some(AMQPValue::LongString(LongString::from(s)))
}

/// Waits until every id is in its tenant's set: its score there.
async fn stored_in_tenants(t: &Intake, ids: &[(&str, String)], d: &Daemon) -> Vec<f64> {
    let f = family(&t.key);
    let mut r = t.redis.clone();
    let start = Instant::now();
    loop {
        let mut pipe = redis::pipe();
        for (tenant, id) in ids {
            pipe.zscore(f.tenant_set(tenant.as_bytes()), id);
        }
        let scores: Vec<Option<f64>> = pipe.query_async(&mut r).await.unwrap();
        if scores.iter().all(Option::is_some) {
            return scores.into_iter().flatten().collect();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not all in their tenants' sets within 10 s: {scores:?}; log:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The earliest due time (ms) in `tenant`'s set, once one is stored.
async fn first_due_in(t: &Intake, tenant: &str) -> i64 {
    let set = family(&t.key).tenant_set(tenant.as_bytes());
    let mut r = t.redis.clone();
    let start = Instant::now();
    loop {
        let first: Vec<(String, f64)> = query(&mut r, "ZRANGE", (&set, 0, 0, "WITHSCORES")).await;
        if let Some((_, due)) = first.first() {
            return *due as i64;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nothing in {tenant}'s set within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With `tenant_header`, each intake message goes into the tenant its
/// header names and the tenant into the index at its earliest due time,
/// nothing into `K`; each is delivered once, not before its due time.
#[tokio::test]
async fn the_tenant_header_puts_each_message_in_its_tenant_delivered_once_at_its_due_time() {
    let (t, d) = Intake::direct_started("tenants = true", TENANT_HEADER).await;
    let plan = [("acme", 1_500), ("acme", 1_200), ("zeta", 1_800)];
    let ids: Vec<(&str, String)> = plan.iter().map(|(t, _)| (*t, unique("m"))).collect();
    for ((tenant, delay), (_, id)) in plan.iter().zip(&ids) {
        t.publish("", id.as_bytes(), of_tenant(text(tenant), *delay, id))
            .await;
    }
    let dues = stored_in_tenants(&t, &ids, &d).await;
    let f = family(&t.key);
    let mut r = t.redis.clone();
    let index: Vec<(String, f64)> = zrange_scores(&mut r, &f.tenant_index()).await;
    assert_eq!(
        index,
        vec![
            ("acme".to_string(), dues[0].min(dues[1])),
            ("zeta".to_string(), dues[2])
        ],
        "each tenant in the index at its earliest due time"
    );
    assert_eq!(zcard(&mut r, &t.key).await, 0, "nothing in K");

    let want: std::collections::HashSet<Vec<u8>> =
        ids.iter().map(|(_, id)| id.as_bytes().to_vec()).collect();
    wait_n(&t.inbox, 3, Duration::from_secs(15), &d).await;
    t.inbox.settle(Duration::from_millis(500)).await;
    let got = t.inbox.assert_each_once(&want, "an intake with tenants");
    for ((_, id), due) in ids.iter().zip(&dues) {
        let r = got.iter().find(|r| r.body == id.as_bytes()).unwrap();
        assert!(
            r.at_ms >= *due as i64,
            "{id} arrived {} ms before its due time",
            *due as i64 - r.at_ms
        );
    }
    t.stop(d).await;
}

/// A tenant header that cannot name a tenant (missing, empty, binary, 4 kB
/// long, an integer, a table) never stops the intake nor loses the message:
/// each goes to the "default" tenant and is delivered once.
#[tokio::test]
async fn hostile_tenant_headers_go_to_the_default_tenant_and_are_each_delivered_once() {
    let (t, d) = Intake::direct_started("tenants = true", TENANT_HEADER).await;
    let mut table = FieldTable::default();
    table.insert("x".into(), AMQPValue::LongInt(1));
    let hostile = [
        None,
        text(""),
        Some(AMQPValue::LongString(LongString::from(vec![0xff, 0xfe, 0]))),
        Some(AMQPValue::LongString(LongString::from("t".repeat(4_000)))),
        text(&"t".repeat(201)),
        Some(AMQPValue::LongLongInt(42)),
        Some(AMQPValue::FieldTable(table)),
    ];
    let ids: Vec<(&str, String)> = hostile.iter().map(|_| ("default", unique("h"))).collect();
    for (value, (_, id)) in hostile.into_iter().zip(&ids) {
        t.publish("", id.as_bytes(), of_tenant(value, 1_000, id))
            .await;
    }
    let good = unique("good");
    t.publish("", good.as_bytes(), of_tenant(text("acme"), 1_000, &good))
        .await;
    stored_in_tenants(&t, &ids, &d).await;
    stored_in_tenants(&t, &[("acme", good.clone())], &d).await;
    let mut want: std::collections::HashSet<Vec<u8>> =
        ids.iter().map(|(_, id)| id.as_bytes().to_vec()).collect();
    want.insert(good.into_bytes());
    wait_n(&t.inbox, want.len(), Duration::from_secs(15), &d).await;
    t.inbox.settle(Duration::from_millis(500)).await;
    t.inbox.assert_each_once(&want, "hostile tenant headers");
    assert_eq!(
        d.logs().matches("consuming the intake queue").count(),
        1,
        "the intake kept its channel:\n{}",
        d.tail()
    );
    t.stop(d).await;
}

/// A heavy tenant's burst through the intake (6,000 messages due at once
/// behind max_rate = 2000, a 3 s drain) does not make light tenants'
/// messages, due during that drain, late: in due order they would wait
/// seconds behind it. The light due times are set from the burst's first
/// stored due time, not from the clock after its confirms, which a loaded
/// machine can push past the drain. What is asserted is what the fair claim
/// decides: no claim run once a light message was due (on Redis's clock)
/// moved the heavy tenant's members and left it waiting. Milliseconds are
/// printed, not asserted: on a loaded machine (CI at d53985c) a stall of
/// the whole host made one 211 ms late, and a stall says nothing of
/// fairness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_tenants_burst_through_the_intake_does_not_make_a_light_tenant_late() {
    let (t, d) = Intake::direct_started("tenants = true\nmax_rate = 2000", TENANT_HEADER).await;
    // The light tenants' own queue and consumer, on a connection of their
    // own, as a tenant's consumers would be: in the heavy tenant's queue
    // they would wait behind its drain in the broker and the consumer.
    let light_amqp = amqp_at(&amqp_url()).await;
    let admin = light_amqp.create_channel().await.unwrap();
    let light_queue = unique("light-q");
    declare_queue(&admin, &light_queue).await;
    bind_key(&admin, &light_queue, &t.target, "light").await;
    let light_inbox = consume(&light_amqp, &light_queue).await;
    // The burst, published without waiting for each confirm.
    let mut confirms = Vec::new();
    for i in 0..6_000 {
        let id = format!("heavy-{i}");
        let props = of_tenant(text("heavy"), 5_000, &id);
        confirms.push(publish_props(&t.ch, &t.exchange, "", id.as_bytes(), props).await);
    }
    assert_acked(confirms, Duration::from_secs(30)).await;
    // Ten light tenants, one message each, due from 0.5 s to 1.85 s after
    // the burst's first message is.
    let first_heavy = first_due_in(&t, "heavy").await;
    let light: Vec<(String, String)> = (0..10)
        .map(|i| (format!("light{i}"), unique("light")))
        .collect();
    for (i, (tenant, id)) in light.iter().enumerate() {
        let delay = (first_heavy + 500 + i as i64 * 150 - wall_ms()) as i32;
        assert!(
            delay > 0,
            "the burst's first message came due before the light ones were published"
        );
        t.publish("light", id.as_bytes(), of_tenant(text(tenant), delay, id))
            .await;
    }
    let named: Vec<(&str, String)> = light
        .iter()
        .map(|(t, id)| (t.as_str(), id.clone()))
        .collect();
    let dues = stored_in_tenants(&t, &named, &d).await;
    let released = watch_released(&t.redis, &t.key, &named, "heavy");
    let heavy: HashSet<Vec<u8>> = (0..6_000)
        .map(|i| format!("heavy-{i}").into_bytes())
        .collect();
    let light_bodies: HashSet<Vec<u8>> =
        light.iter().map(|(_, id)| id.as_bytes().to_vec()).collect();
    let start = Instant::now();
    while !heavy.is_subset(&t.inbox.bodies()) || !light_bodies.is_subset(&light_inbox.bodies()) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} of 6000 heavy and {} of 10 light delivered within 60 s; log:\n{}",
            t.inbox.len(),
            light_inbox.len(),
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = t
        .inbox
        .assert_each_once(&heavy, "a burst through the intake");
    let got_light = light_inbox.assert_each_once(&light_bodies, "the light tenants");
    let heavy_last = got.iter().map(|r| r.at_ms).max().unwrap();
    let last_light_due = dues.iter().fold(0f64, |a, b| a.max(*b)) as i64;
    assert!(
        heavy_last > last_light_due + 300,
        "the heavy drain ended before the light messages came due: the test shows nothing"
    );
    let released = released.await.unwrap();
    let (mut late, mut delivered) = (Vec::new(), Vec::new());
    for (((_, id), due), at) in light.iter().zip(&dues).zip(&released.at) {
        let r = got_light.iter().find(|r| r.body == id.as_bytes()).unwrap();
        assert!(r.at_ms >= *due as i64, "a light message arrived early");
        // Each is a moment after the release, seen by this process: the
        // earlier one is the closer bound on it.
        late.push(at.min(&r.at_ms) - *due as i64);
        delivered.push(r.at_ms - *due as i64);
    }
    late.sort();
    delivered.sort();
    eprintln!(
        "light lateness ms at release: p50 {} max {}; at the consumer: p50 {} max {}; heavy's last {} ms after the last light due time; heavy members released past a due light one: {:?}",
        late[late.len() / 2],
        late.last().unwrap(),
        delivered[delivered.len() / 2],
        delivered.last().unwrap(),
        heavy_last - last_light_due,
        released.passed_over_by
    );
    for ((tenant, _), passed) in light.iter().zip(&released.passed_over_by) {
        assert_eq!(
            *passed, 0,
            "claims run after {tenant}'s message was due released {passed} of the heavy tenant's members and left it waiting"
        );
    }
    delete_topology(&admin, &[&light_queue], &[]).await;
    t.stop(d).await;
}
