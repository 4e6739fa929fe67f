//! delayd's own W3C trace context for a publish (`trace = "link"`).
//!
//! A new trace per publish, not a child of the producer's: OpenTelemetry's
//! messaging conventions link a consumer to the context a message was
//! created in instead of parenting it, because the work may run hours after
//! the producer's trace ended; a child would stretch that trace over the
//! whole delay. The producer's context stays on the message under
//! [`PRODUCER_TRACEPARENT`] and [`PRODUCER_TRACESTATE`], for the consumer to
//! add as a span link.

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

/// Where the producer's `traceparent` goes when delayd writes its own.
pub const PRODUCER_TRACEPARENT: &str = "x-delayd-producer-traceparent";
/// Where the producer's `tracestate` goes when delayd writes its own.
pub const PRODUCER_TRACESTATE: &str = "x-delayd-producer-tracestate";

/// `props` with a `traceparent` of a new trace (random trace and span ids,
/// the producer's sampled flag or sampled when it set none) and the
/// producer's context, if any, moved to the `x-delayd-producer-*` headers.
pub fn link(props: BasicProperties) -> BasicProperties {
    let mut headers: BTreeMap<ShortString, AMQPValue> = props
        .headers()
        .as_ref()
        .map_or_else(BTreeMap::new, |h| h.inner().clone());
    let parent = headers.remove(&ShortString::from("traceparent"));
    let state = headers.remove(&ShortString::from("tracestate"));
    let flags = parent
        .as_ref()
        .and_then(sampled_flags)
        .unwrap_or("01".into());
    if let Some(p) = parent {
        headers.insert(PRODUCER_TRACEPARENT.into(), p);
    }
    if let Some(s) = state {
        headers.insert(PRODUCER_TRACESTATE.into(), s);
    }
    headers.insert("traceparent".into(), long(&new_traceparent(&flags)));
    props.with_headers(FieldTable::from(headers))
}

/// The flags field of a well-formed version-00 `traceparent`.
fn sampled_flags(v: &AMQPValue) -> Option<String> {
    let text = match v {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?,
        AMQPValue::ShortString(s) => s.as_str(),
        _ => return None,
    };
    let parts: Vec<&str> = text.trim().split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match parts[..] {
        ["00", t, s, f] if hex(t, 32) && hex(s, 16) && hex(f, 2) => Some(f.to_ascii_lowercase()),
        _ => None,
    }
}

/// A version-00 `traceparent` with random, never all-zero, trace and span ids.
fn new_traceparent(flags: &str) -> String {
    let trace = rand::random::<u128>().max(1);
    let span = rand::random::<u64>().max(1);
    format!("00-{trace:032x}-{span:016x}-{flags}")
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(h: &FieldTable, name: &str) -> Option<String> {
        match h.inner().get(name)? {
            AMQPValue::LongString(s) => Some(String::from_utf8(s.as_bytes().to_vec()).unwrap()),
            _ => None,
        }
    }

    const PRODUCER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

    /// The publish gets a new trace; the producer's context, flags and
    /// other headers survive where the consumer can find them.
    #[test]
    fn linking_moves_the_producers_context_aside_and_starts_a_new_trace() {
        let mut h = FieldTable::default();
        h.insert("traceparent".into(), long(PRODUCER));
        h.insert("tracestate".into(), long("congo=t61rcWkgMzE"));
        h.insert("tenant".into(), long("acme"));
        let out = link(BasicProperties::default().with_headers(h));
        let h = out.headers().as_ref().unwrap();
        assert_eq!(text(h, PRODUCER_TRACEPARENT).as_deref(), Some(PRODUCER));
        assert_eq!(
            text(h, PRODUCER_TRACESTATE).as_deref(),
            Some("congo=t61rcWkgMzE")
        );
        assert_eq!(text(h, "tenant").as_deref(), Some("acme"));
        assert!(text(h, "tracestate").is_none(), "a new trace has no state");
        let own = text(h, "traceparent").unwrap();
        let parts: Vec<&str> = own.split('-').collect();
        assert_eq!(parts.len(), 4, "{own}");
        assert_eq!((parts[0], parts[3]), ("00", "00"), "the producer's flags");
        assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{own}");
        assert_ne!(parts[1], "0af7651916cd43dd8448eb211c80319c");
        assert!(sampled_flags(&long(&own)).is_some(), "well formed: {own}");
    }

    /// A message no producer traced still gets delayd's context, sampled.
    #[test]
    fn a_message_without_a_producers_context_gets_a_sampled_one_and_no_link() {
        let out = link(BasicProperties::default());
        let h = out.headers().as_ref().unwrap();
        assert!(text(h, "traceparent").unwrap().ends_with("-01"));
        assert!(text(h, PRODUCER_TRACEPARENT).is_none());
    }
}
