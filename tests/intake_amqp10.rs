//! AMQP 1.0 producers on RabbitMQ 4: a real AMQP 1.0 client (fe2o3-amqp)
//! publishes to the intake exchange's `/exchanges/NAME/KEY` address with the
//! message annotations RabbitMQ 4's clients set for a delay, and a 0-9-1
//! consumer of the target receives the message when it is due, with what
//! RabbitMQ made of the annotations.
//!
//! RabbitMQ 3.x has neither that address scheme nor AMQP 1.0 without a
//! plugin, so these tests are ignored in a plain run (on any set) and run by
//! `deploy/local/test.sh` with `--include-ignored` on the RabbitMQ 4 sets,
//! where a broker older than 4 fails them rather than passing unseen.

use delayd_test_support as common;

use common::*;
use fe2o3_amqp::types::messaging::{Header, Message, MessageAnnotations, Properties};
use fe2o3_amqp::types::primitives::{Binary, Value};
use fe2o3_amqp::{Connection as Amqp10, Sender, Session};
use lapin::types::AMQPValue;
use std::io::Read;
use std::time::Duration;

const NEEDS_4: &str =
    "needs RabbitMQ 4 (AMQP 1.0 addresses); deploy/local/test.sh runs it on the rabbitmq4 sets";

/// The broker's version from the server properties of its `connection.start`.
fn broker_version(amqp_url: &str) -> String {
    let port = amqp_url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse::<u16>().ok())
        .expect("port in the AMQP URL");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("RabbitMQ answers");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut s, b"AMQP\x00\x00\x09\x01").unwrap();
    let mut head = [0u8; 7];
    s.read_exact(&mut head).unwrap();
    let mut frame = vec![0u8; u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize];
    s.read_exact(&mut frame).unwrap();
    // ... 7 "version" 'S' <u32 length> <text> ...
    let at = frame
        .windows(9)
        .position(|w| w == b"\x07versionS")
        .expect("a version in the server properties")
        + 9;
    let len = u32::from_be_bytes(frame[at..at + 4].try_into().unwrap()) as usize;
    String::from_utf8_lossy(&frame[at + 4..at + 4 + len]).into_owned()
}

/// Fails unless the shared broker is RabbitMQ 4 or later.
fn require_rabbitmq4() {
    let v = broker_version(&amqp_url());
    let major: u32 = v.split('.').next().unwrap().parse().unwrap();
    assert!(
        major >= 4,
        "RabbitMQ {v} at {} has no AMQP 1.0 address scheme: this test {NEEDS_4}",
        amqp_url()
    );
}

/// An intake business on the shared servers: a direct target exchange with a
/// consumed queue bound by `rk`, and delayd consuming its intake queue.
struct Intake {
    _dir: tempfile::TempDir,
    exchange: String,
    rk: String,
    inbox: Inbox,
    daemon: Daemon,
}

impl Intake {
    /// Starts it all; the tests need RabbitMQ 4 (AMQP 1.0 addresses).
    async fn start() -> Self {
        require_rabbitmq4();
        let amqp = amqp_at(&amqp_url()).await;
        let ch = amqp.create_channel().await.unwrap();
        let spec = BusinessSpec::random("amqp10");
        let exchange = unique("intake-ex");
        let queue = unique("intake-q");
        let consumer = unique("consumer");
        declare(&ch, &spec.exchange, &consumer, &spec.routing_key).await;
        let inbox = consume(&amqp, &consumer).await;
        let spec = BusinessSpec {
            extra: format!(
                "properties = \"standard\"\n[businesses.amqp10.intake]\nexchange = \"{exchange}\"\nqueue = \"{queue}\"\n"
            ),
            ..spec
        };
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&spec]);
        let daemon = Daemon::start(&config);
        wait_consumed_queue(&amqp, &queue, &daemon).await;
        Intake {
            _dir: dir,
            exchange,
            rk: spec.routing_key,
            inbox,
            daemon,
        }
    }

    /// Publishes `body` with `annotations` and message-id `id` from an AMQP
    /// 1.0 client to `/exchanges/<intake>/<rk>`, and waits until RabbitMQ
    /// accepts it. Returns the wall time just before the send.
    async fn publish(&self, id: &str, body: &[u8], annotations: &[(&str, Value)]) -> i64 {
        let url = amqp_url();
        // amqp://user:pass@host:port/%2f: AMQP 1.0 names the vhost otherwise.
        let base = url.rsplit_once('/').unwrap().0;
        let mut conn = Amqp10::open(unique("amqp10-producer"), base)
            .await
            .expect("AMQP 1.0 connection to RabbitMQ");
        let mut session = Session::begin(&mut conn).await.unwrap();
        let address = format!("/exchanges/{}/{}", self.exchange, self.rk);
        let mut sender = Sender::attach(&mut session, unique("sender"), address.as_str())
            .await
            .unwrap_or_else(|e| panic!("attach to {address}: {e}"));
        let mut ma = MessageAnnotations::builder();
        for (k, v) in annotations {
            ma = ma.insert(*k, v.clone());
        }
        let message = Message::builder()
            .header(Header::builder().durable(true).build())
            .message_annotations(ma.build())
            .properties(Properties::builder().message_id(id.to_string()).build())
            .data(Binary::from(body.to_vec()))
            .build();
        let sent = wall_ms();
        sender
            .send(message)
            .await
            .unwrap()
            .accepted_or_else(|state| state)
            .unwrap_or_else(|e| panic!("RabbitMQ did not accept the message: {e:?}"));
        sender.close().await.unwrap();
        session.end().await.unwrap();
        conn.close().await.unwrap();
        sent
    }

    async fn received(&self) -> Received {
        self.inbox.wait_for(1, Duration::from_secs(20)).await;
        self.inbox.all().remove(0)
    }
}

#[tokio::test]
#[ignore = "needs RabbitMQ 4 (AMQP 1.0 addresses); deploy/local/test.sh runs it on the rabbitmq4 sets"]
async fn an_amqp10_delivery_delay_annotation_is_honoured_and_reaches_consumers_as_a_header() {
    let i = Intake::start().await;
    let delay = [("x-opt-delivery-delay", Value::Long(1500))];
    let sent = i
        .publish("amqp10-delay", b"\x00binary\xffbody", &delay)
        .await;
    let r = i.received().await;
    assert!(
        r.at_ms >= sent + 1500,
        "delivered {} ms after the publish, before its 1500 ms delay:\n{}",
        r.at_ms - sent,
        i.daemon.tail()
    );
    assert!(
        r.at_ms < sent + 6500,
        "delivered {} ms late",
        r.at_ms - sent - 1500
    );
    assert_eq!(r.body, b"\x00binary\xffbody");
    assert_eq!(r.routing_key, i.rk);
    assert_eq!(r.message_id.as_deref(), Some("amqp10-delay"));
    assert_eq!(
        r.headers.get("x-opt-delivery-delay"),
        Some(&AMQPValue::LongLongInt(1500)),
        "the annotation, as RabbitMQ hands it to 0-9-1 consumers: {:?}",
        r.headers
    );
}

#[tokio::test]
#[ignore = "needs RabbitMQ 4 (AMQP 1.0 addresses); deploy/local/test.sh runs it on the rabbitmq4 sets"]
async fn an_amqp10_delivery_time_annotation_is_honoured() {
    let i = Intake::start().await;
    let due = wall_ms() + 2000;
    i.publish(
        "amqp10-time",
        b"at a time",
        &[("x-opt-delivery-time", Value::Long(due))],
    )
    .await;
    let r = i.received().await;
    assert!(
        r.at_ms >= due,
        "delivered {} ms before its x-opt-delivery-time:\n{}",
        due - r.at_ms,
        i.daemon.tail()
    );
    assert!(r.at_ms < due + 5000, "delivered {} ms late", r.at_ms - due);
    assert_eq!(r.body, b"at a time");
    assert_eq!(
        r.headers.get("x-opt-delivery-time"),
        Some(&AMQPValue::LongLongInt(due))
    );
}

#[tokio::test]
#[ignore = "needs RabbitMQ 4 (AMQP 1.0 addresses); deploy/local/test.sh runs it on the rabbitmq4 sets"]
async fn a_delivery_delay_annotation_comes_before_a_delivery_time() {
    let i = Intake::start().await;
    let both = [
        ("x-opt-delivery-time", Value::Long(wall_ms() + 600_000)),
        ("x-opt-delivery-delay", Value::Long(500)),
    ];
    let sent = i.publish("amqp10-both", b"both", &both).await;
    let r = i.received().await;
    assert!(r.at_ms >= sent + 500, "delivered before its 500 ms delay");
    assert!(
        r.at_ms < sent + 10_000,
        "the delay did not decide: delivered after {} ms",
        r.at_ms - sent
    );
}
