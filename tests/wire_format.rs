//! docs/wire-format.md is what delayd reads: its envelope bytes decode to
//! the message it describes and that message encodes back to them; an
//! envelope a producer stores on an id-mode business with `envelopes = true`
//! is published with its own routing key and headers (W3C trace context
//! included), and as plain bytes where envelopes are off; `delayd check`
//! states the version the page carries.

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use delayd::message::envelope;
use lapin::types::{AMQPValue, ShortString};

/// The bytes of the one ```hex block of docs/wire-format.md.
fn documented_envelope() -> Vec<u8> {
    doc_block("wire-format.md", "hex")
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn long_string(v: Option<&AMQPValue>) -> Option<Vec<u8>> {
    match v {
        Some(AMQPValue::LongString(s)) => Some(s.as_bytes().to_vec()),
        _ => None,
    }
}

#[test]
fn the_documented_envelope_decodes_to_its_message_and_encodes_back_to_its_bytes() {
    let stored = documented_envelope();
    assert_eq!(stored.len(), 157, "the page says 157 bytes");
    let e = envelope::decode(&stored).expect("the documented bytes are an envelope");
    assert_eq!(e.routing_key, "order.timeout");
    assert_eq!(e.body, b"{\"order\":42}");
    let p = &e.properties;
    assert_eq!(
        p.content_type().as_ref().map(ShortString::as_str),
        Some("application/json")
    );
    assert_eq!(*p.delivery_mode(), Some(2));
    let h = p.headers().as_ref().expect("headers").inner();
    assert_eq!(
        long_string(h.get(&ShortString::from("traceparent"))),
        Some(TRACEPARENT.as_bytes().to_vec())
    );
    assert_eq!(
        long_string(h.get(&ShortString::from("tracestate"))),
        Some(b"congo=t61rcWkgMzE".to_vec())
    );
    assert_eq!(h.len(), 2);
    assert_eq!(
        envelope::encode(e.routing_key, &e.properties, e.body).unwrap(),
        stored
    );
}

#[test]
fn check_states_the_wire_format_version_the_page_describes() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/wire-format.md"),
    )
    .unwrap();
    let title = page.lines().next().unwrap();
    let version = title
        .strip_prefix("# Wire format, version ")
        .expect("the page's title names its version");
    let b = BusinessSpec::random("versioned");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    // The exchange is missing, so check fails; the version line comes first.
    let (_, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    let line = out
        .lines()
        .find(|l| l.starts_with("wire "))
        .unwrap_or_else(|| panic!("no wire format line:\n{out}{err}"));
    assert!(
        line.contains(&format!("format {version}:")),
        "{line:?}, the page is version {version}"
    );
    assert_eq!(version, delayd::message::WIRE_FORMAT.to_string());
}

#[tokio::test]
async fn a_producers_envelope_is_published_with_its_routing_key_and_headers_only_where_envelopes_are_on(
) {
    let mut on = BusinessSpec::with_extra("enveloped", "member = \"id\"\nenvelopes = true");
    on.routing_key = "order.timeout".into();
    let off = BusinessSpec::with_extra("plain", "member = \"id\"");
    let t = Setup::new(&[&on, &off]).await;
    let mut d = Daemon::start(&t.config);
    let stored = documented_envelope();
    let mut redis = redis().await;
    let now = redis_now_ms(&mut redis).await;
    for b in [&on, &off] {
        let _: () = redis::pipe()
            .atomic()
            .hset(
                delayd::keys::helper_key(&b.key, "body"),
                "order-42",
                &stored,
            )
            .zadd(&b.key, "order-42", now)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    t.inboxes[0].wait_for(1, Duration::from_secs(20)).await;
    t.inboxes[1].wait_for(1, Duration::from_secs(20)).await;
    let enveloped = t.inboxes[0].all().remove(0);
    assert_eq!(enveloped.body, b"{\"order\":42}");
    assert_eq!(enveloped.routing_key, "order.timeout");
    assert_eq!(
        long_string(enveloped.headers.get("traceparent")),
        Some(TRACEPARENT.as_bytes().to_vec())
    );
    assert_eq!(enveloped.content_type.as_deref(), Some("application/json"));
    let plain = t.inboxes[1].all().remove(0);
    assert_eq!(
        plain.body, stored,
        "envelopes off: the stored bytes as they are"
    );
    assert_eq!(plain.routing_key, off.routing_key);
    assert!(!plain.headers.contains_key("traceparent"));
    for b in [&on, &off] {
        wait_family_empty(&mut redis, &b.key, Duration::from_secs(10)).await;
    }
    d.signal(15);
    d.wait(Duration::from_secs(20));
}
