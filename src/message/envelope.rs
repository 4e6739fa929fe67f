//! The stored form of an intake message: what `{K}:body` holds for its id.
//!
//! Compact on purpose (it is most of the memory a pending message costs):
//!
//! | bytes | content |
//! | --- | --- |
//! | 2 | `0xFF`, then the format version (1) |
//! | 1 + n | the routing key: its length, then its bytes |
//! | 2 + … | the properties in AMQP's own content-header encoding (flags, then the set fields) |
//! | rest | the body |
//!
//! `0xFF` never starts UTF-8 text, and a body that happens to start like an
//! envelope but does not parse as one whole is published as it is: a task
//! scheduled on an intake business by other means (`delayd schedule`) still
//! goes out as a plain id-mode message.

use lapin::protocol::basic::{gen_properties, parse_properties};
use lapin::BasicProperties;

const MAGIC: u8 = 0xFF;
const VERSION: u8 = 1;

/// A message as delayd publishes it: an intake message as its producer
/// published it, or one built for a claimed member ([`super::of`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    /// The routing key the producer published with.
    pub routing_key: &'a str,
    /// Every property the producer set, headers included.
    pub properties: BasicProperties,
    /// The body, unchanged.
    pub body: &'a [u8],
}

/// Why a message cannot be stored.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The properties could not be encoded (a value AMQP cannot carry).
    #[error("its properties cannot be encoded: {0}")]
    Properties(String),
}

/// Encodes a message: version, routing key, properties, body.
pub fn encode(
    routing_key: &str,
    properties: &BasicProperties,
    body: &[u8],
) -> Result<Vec<u8>, EnvelopeError> {
    let rk = routing_key.as_bytes();
    // A routing key is a short string: the broker never delivers a longer one.
    let rk_len = u8::try_from(rk.len())
        .map_err(|_| EnvelopeError::Properties("routing key over 255 bytes".into()))?;
    let mut out = Vec::with_capacity(3 + rk.len() + 64 + body.len());
    out.extend_from_slice(&[MAGIC, VERSION, rk_len]);
    out.extend_from_slice(rk);
    let out = gen_properties(properties)(out.into())
        .map_err(|e| EnvelopeError::Properties(e.to_string()))?
        .write;
    let mut out = out;
    out.extend_from_slice(body);
    Ok(out)
}

/// Decodes what [`encode`] wrote; `None` for anything else.
pub fn decode(stored: &[u8]) -> Option<Envelope<'_>> {
    let [MAGIC, VERSION, rk_len, rest @ ..] = stored else {
        return None;
    };
    let rk_len = *rk_len as usize;
    if rest.len() < rk_len {
        return None;
    }
    let (rk, rest) = rest.split_at(rk_len);
    let routing_key = std::str::from_utf8(rk).ok()?;
    let (body, properties) = parse_properties(rest).ok()?;
    Some(Envelope {
        routing_key,
        properties,
        body,
    })
}

/// What `delayd get` shows of a stored intake message besides its body:
/// the routing key, and each property the producer set (headers by name,
/// each value as AMQP typed it), so an operator sees what will be published.
pub fn describe(e: &Envelope<'_>) -> serde_json::Value {
    let p = &e.properties;
    let mut props = serde_json::Map::new();
    let mut put = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            props.insert(name.into(), v.into());
        }
    };
    let short = |s: &Option<lapin::types::ShortString>| s.as_ref().map(|s| s.to_string());
    put("content_type", short(p.content_type()));
    put("content_encoding", short(p.content_encoding()));
    put("delivery_mode", p.delivery_mode().map(|m| m.to_string()));
    put("priority", p.priority().map(|m| m.to_string()));
    put("correlation_id", short(p.correlation_id()));
    put("reply_to", short(p.reply_to()));
    put("expiration", short(p.expiration()));
    put("message_id", short(p.message_id()));
    put("timestamp", p.timestamp().map(|t| t.to_string()));
    put("type", short(p.kind()));
    put("user_id", short(p.user_id()));
    put("app_id", short(p.app_id()));
    if let Some(h) = p.headers() {
        let headers: serde_json::Map<String, serde_json::Value> = h
            .inner()
            .iter()
            .map(|(k, v)| (k.to_string(), format!("{v:?}").into()))
            .collect();
        props.insert("headers".into(), headers.into());
    }
    serde_json::json!({ "routing_key": e.routing_key, "properties": props })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

    fn every_property() -> BasicProperties {
        let mut nested = FieldTable::default();
        nested.insert("n".into(), AMQPValue::ShortShortInt(-3));
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(5000));
        h.insert("b".into(), AMQPValue::Boolean(true));
        h.insert("u8".into(), AMQPValue::ShortShortUInt(200));
        h.insert("i16".into(), AMQPValue::ShortInt(-300));
        h.insert("u16".into(), AMQPValue::ShortUInt(60000));
        h.insert("u32".into(), AMQPValue::LongUInt(4_000_000_000));
        h.insert("i64".into(), AMQPValue::LongLongInt(-(1 << 40)));
        h.insert("f".into(), AMQPValue::Float(1.5));
        h.insert("d".into(), AMQPValue::Double(2.25));
        h.insert(
            "dec".into(),
            AMQPValue::DecimalValue(lapin::types::DecimalValue {
                scale: 2,
                value: 12345,
            }),
        );
        h.insert(
            "s".into(),
            AMQPValue::LongString(LongString::from(b"\x00\xffbin".to_vec())),
        );
        h.insert(
            "arr".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::LongInt(1),
                AMQPValue::Void,
            ])),
        );
        h.insert("ts".into(), AMQPValue::Timestamp(1_700_000_000));
        h.insert("t".into(), AMQPValue::FieldTable(nested));
        h.insert("x".into(), AMQPValue::ByteArray(vec![1u8, 2, 3].into()));
        h.insert("v".into(), AMQPValue::Void);
        BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_content_encoding(ShortString::from("gzip"))
            .with_headers(h)
            .with_delivery_mode(2)
            .with_priority(7)
            .with_correlation_id(ShortString::from("corr-1"))
            .with_reply_to(ShortString::from("replies"))
            .with_expiration(ShortString::from("60000"))
            .with_message_id(ShortString::from("order-42"))
            .with_timestamp(1_700_000_123)
            .with_type(ShortString::from("order.expired"))
            .with_user_id(ShortString::from("guest"))
            .with_app_id(ShortString::from("shop"))
            .with_cluster_id(ShortString::from("c1"))
    }

    #[test]
    fn every_property_and_header_type_round_trips() {
        let props = every_property();
        let body = b"\x00binary body\xff".to_vec();
        let stored = encode("order.created", &props, &body).unwrap();
        let e = decode(&stored).expect("decodes");
        assert_eq!(e.routing_key, "order.created");
        assert_eq!(e.properties, props);
        assert_eq!(e.body, body.as_slice());
        // The body is the tail, so a returned message can be matched cheaply.
        assert!(stored.ends_with(&body));
    }

    #[test]
    fn empty_routing_key_properties_and_body_round_trip() {
        let stored = encode("", &BasicProperties::default(), b"").unwrap();
        assert_eq!(stored.len(), 5, "version, key length, property flags");
        let e = decode(&stored).unwrap();
        assert_eq!(
            (e.routing_key, e.properties, e.body),
            ("", BasicProperties::default(), &b""[..])
        );
    }

    #[test]
    fn plain_bodies_are_not_envelopes() {
        for body in [
            &b""[..],
            b"{\"order\":42}",
            b"\xff",
            b"\xff\x01",
            b"\xff\x01\x05ab",
            b"\xff\x02\x00\x00\x00",
        ] {
            assert!(decode(body).is_none(), "{body:?}");
        }
    }

    #[test]
    fn a_100_byte_message_costs_little_more_than_its_body() {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(60_000));
        let props = BasicProperties::default()
            .with_headers(h)
            .with_delivery_mode(2);
        let stored = encode("order.created", &props, &[b'x'; 100]).unwrap();
        assert!(stored.len() <= 140, "{} bytes", stored.len());
    }
}
