//! The message delayd publishes for a claimed member: its body, routing key,
//! properties and headers, by the business's settings or, for an intake
//! message, as the producer published it ([`envelope`]). The scanner and
//! the publisher read it; the intake writes envelopes.

pub mod delay;
pub mod delivered;
pub mod envelope;
pub mod trace;

pub use envelope::Envelope;

use lapin::message::BasicReturnMessage;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::config::{Business, Properties, Trace};
use crate::store::Claimed;

/// The version of docs/wire-format.md this build reads: the keys, members,
/// scores and envelopes producers may write. A later version only adds
/// forms; every form an earlier version documented is still read.
pub const WIRE_FORMAT: u32 = 2;

/// What to publish for one claimed member: the stored envelope of an intake
/// message, as its producer published it; otherwise the member's body with
/// the business's routing key and [`properties`]; with `trace = "link"`,
/// either with delayd's own trace context ([`trace`]).
pub fn of<'a>(
    business: &'a Business,
    key: &str,
    claimed: &'a Claimed,
    now_ms: i64,
) -> Envelope<'a> {
    let mut m = outgoing(business, claimed).unwrap_or_else(|| Envelope {
        routing_key: business.routing_key.as_str(),
        properties: properties(business, key, claimed, now_ms),
        body: claimed.body(),
    });
    if business.trace == Trace::Link {
        m.properties = trace::link(m.properties);
    }
    m
}

/// A stable id for one scheduled delivery: the same key, member and due time
/// always give the same id, so consumers can drop a redelivery after a crash.
pub fn message_id(key: &str, member: &[u8], due_ms: i64) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key.as_bytes());
    h.update(&(member.len() as u64).to_le_bytes());
    h.update(member);
    h.update(&due_ms.to_le_bytes());
    format!("{:032x}", h.digest128())
}

/// The `message_id` of a claimed member's message: per (key, body, due
/// time) in body mode; per (business, id) in id mode, so consumers can
/// de-duplicate an id across reschedules, retries and redeliveries.
pub fn claimed_message_id(business: &Business, key: &str, claimed: &Claimed) -> String {
    match claimed.body {
        Some(_) => message_id(&business.name, &claimed.member, 0),
        None => message_id(key, &claimed.member, claimed.due_ms),
    }
}

/// The properties of one claimed member's message: persistent unless
/// configured otherwise, a stable `message_id`, and what `properties` adds
/// (see [`Properties`]).
pub fn properties(
    business: &Business,
    key: &str,
    claimed: &Claimed,
    now_ms: i64,
) -> BasicProperties {
    let mut props = BasicProperties::default();
    if business.properties != Properties::Bare {
        props = props.with_message_id(ShortString::from(claimed_message_id(
            business, key, claimed,
        )));
    }
    match business.properties {
        Properties::Standard => props = standard_properties(props, business, claimed),
        Properties::Full | Properties::NoHeaders => {
            props = props.with_timestamp((now_ms.max(0) / 1000) as u64)
        }
        Properties::Bare => {}
    }
    if business.properties == Properties::Full {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-delayd-business".into(),
            AMQPValue::LongString(LongString::from(business.name.as_str())),
        );
        headers.insert(
            "x-delayd-due".into(),
            AMQPValue::LongLongInt(claimed.due_ms),
        );
        headers.insert(
            "x-delayd-attempt".into(),
            AMQPValue::LongLongInt(claimed.attempt as i64),
        );
        props = props.with_headers(headers);
    }
    if business.persistent {
        props = props.with_delivery_mode(2);
    }
    if let Some(ct) = &business.content_type {
        props = props.with_content_type(ShortString::from(ct.as_str()));
    }
    props
}

/// The default message's facts in standard properties, which cost the broker
/// next to nothing; a header table, which costs it a tenth or more of its
/// speed, only on the rare retry.
fn standard_properties(
    props: BasicProperties,
    business: &Business,
    claimed: &Claimed,
) -> BasicProperties {
    let mut props = props
        .with_type(ShortString::from(business.name.as_str()))
        .with_app_id(ShortString::from("delayd"))
        .with_timestamp((claimed.due_ms.max(0) / 1000) as u64);
    if claimed.attempt > 1 {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-delayd-attempt".into(),
            AMQPValue::LongLongInt(claimed.attempt as i64),
        );
        props = props.with_headers(headers);
    }
    props
}

/// Whether the broker's return `ret` is the message published for
/// `claimed`: the same body and, where the return carries one, the same
/// `message_id` (for an intake message, also the same routing key).
pub fn is_return_of(
    business: &Business,
    key: &str,
    claimed: &Claimed,
    ret: &BasicReturnMessage,
) -> bool {
    if let Some(is) = returned_is(business, claimed, ret) {
        return is;
    }
    let id = ret.properties.message_id().as_ref().map(|s| s.as_str());
    claimed.body() == ret.delivery.data.as_slice()
        && id.is_none_or(|id| id == claimed_message_id(business, key, claimed))
}

/// The body the broker receives for `claimed`, which its `max_message_size`
/// judges: the envelope's body for an intake message (the stored envelope
/// also holds its routing key and properties), else the member's body.
pub fn published_body<'a>(business: &Business, claimed: &'a Claimed) -> &'a [u8] {
    outgoing(business, claimed).map_or(claimed.body(), |e| e.body)
}

/// The message to publish for a claimed member of an intake business: the
/// stored envelope, or `None` for a plain body (a task scheduled another
/// way, published as any id-mode task).
fn outgoing<'a>(business: &Business, claimed: &'a Claimed) -> Option<Envelope<'a>> {
    stored(business, claimed.body())
}

/// The message stored as `body`, when `business` stores envelopes and the
/// body is one (a task scheduled another way is a plain body).
pub fn stored<'a>(business: &Business, body: &'a [u8]) -> Option<Envelope<'a>> {
    if !business.stores_envelopes() {
        return None;
    }
    envelope::decode(body)
}

/// Whether `ret` is the intake message `claimed` was published as: the same
/// body, routing key and `message_id`. `None` for a member that is not an
/// intake message.
fn returned_is(business: &Business, claimed: &Claimed, ret: &BasicReturnMessage) -> Option<bool> {
    // The body is the envelope's tail: most members fail this cheap test.
    if !claimed.body().ends_with(&ret.delivery.data) {
        return outgoing(business, claimed).map(|_| false);
    }
    let e = outgoing(business, claimed)?;
    Some(
        e.body == ret.delivery.data.as_slice()
            && e.routing_key == ret.delivery.routing_key.as_str()
            && e.properties.message_id() == ret.delivery.properties.message_id(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An intake message whose body fits the broker's `max_message_size`
    /// while its stored envelope (routing key and properties too) does not
    /// is not the one the broker refused: judged by the body it receives.
    #[test]
    fn the_published_body_of_an_intake_message_is_the_envelopes_body() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(
            &mut f,
            b"[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
              [businesses.b]\nkey = \"k\"\nexchange = \"e\"\nrouting_key = \"r\"\n\
              [businesses.b.intake]\nexchange = \"i\"\nqueue = \"q\"\n",
        )
        .unwrap();
        let cfg = crate::config::load(f.path()).unwrap();
        let business = &cfg.businesses[0];
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "trace".into(),
            lapin::types::AMQPValue::LongString(vec![b'h'; 4000].into()),
        );
        let props = lapin::BasicProperties::default().with_headers(headers);
        let env = envelope::encode("rk", &props, b"small body").unwrap();
        let claimed = Claimed {
            member: b"id-1".to_vec(),
            due_ms: 0,
            attempt: 1,
            body: Some(env.clone()),
            tenant: None,
        };
        assert!(claimed.body().len() > 4000, "the envelope holds the header");
        assert_eq!(published_body(business, &claimed), b"small body");
    }

    #[test]
    fn message_id_is_stable_and_distinguishes_inputs() {
        let a = message_id("k", b"body", 1000);
        assert_eq!(a, message_id("k", b"body", 1000));
        assert_eq!(a.len(), 32);
        assert_ne!(a, message_id("k", b"body", 1001));
        assert_ne!(a, message_id("k2", b"body", 1000));
        assert_ne!(a, message_id("k", b"bodx", 1000));
        // Length prefixes keep key and member from running into each other.
        assert_ne!(message_id("ab", b"c", 1), message_id("a", b"bc", 1));
    }
}
