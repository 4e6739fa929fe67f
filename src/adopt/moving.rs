//! From a plugin entry to a stored message: the envelope the intake would
//! have stored for the same publish, and the ids that make a rerun safe.
//! [`super::staging`] writes it to Redis.

use lapin::protocol::basic::parse_properties;

use crate::config::intake_settings::Settings;
use crate::message::{delay, delivered, envelope};

use super::lines::Entry;

/// One entry, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moving {
    /// The entry's stable name: 32 hex digits of a hash of its node, due
    /// time and ref. The id when it has no `message_id`.
    pub name: String,
    /// The id it is stored under: its `message_id`, or `name`.
    pub id: Vec<u8>,
    /// The node whose plugin holds it.
    pub node: String,
    /// Its ref there, as read.erl printed it.
    pub reference: String,
    /// Its due time, epoch ms.
    pub due_ms: i64,
    /// What `{K}:body` holds for it.
    pub envelope: Vec<u8>,
}

/// The entry's stable name on `node` (see [`Moving::name`]).
pub fn name_of(node: &str, entry: &Entry) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [node.as_bytes(), entry.reference.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&entry.due_ms.to_le_bytes());
    format!("{:032x}", h.digest128())
}

/// The message as the intake would have stored it from the same publish:
/// the producer's routing key, properties and body, `x-delay` and
/// `user_id` as the intake's settings deliver them. An error names what
/// delayd cannot carry (the entry then stays with the plugin).
pub fn prepare(
    node: &str,
    entry: &Entry,
    settings: &Settings,
    own_user: Option<&str>,
) -> Result<Moving, String> {
    let (_, props) = parse_properties(entry.properties.as_slice())
        .map_err(|e| format!("its properties cannot be read ({e})"))?;
    let routing_key = std::str::from_utf8(&entry.routing_key)
        .map_err(|_| "its routing key is not UTF-8".to_string())?;
    let due = delay::due_of(props.headers().as_ref());
    let (props, _) = delivered::properties(settings, own_user, &props, &due);
    let envelope = envelope::encode(routing_key, &props, &entry.body)
        .map_err(|e| format!("it cannot be stored: {e}"))?;
    let name = name_of(node, entry);
    let id = match props.message_id() {
        Some(m) if !m.as_str().is_empty() => m.as_str().as_bytes().to_vec(),
        _ => name.clone().into_bytes(),
    };
    Ok(Moving {
        name,
        id,
        node: node.to_string(),
        reference: entry.reference.clone(),
        due_ms: entry.due_ms,
        envelope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::intake_settings::{QueueType, ReplicaAck, ReplicaWait, UserId, XDelay};
    use lapin::protocol::basic::gen_properties;
    use lapin::types::{AMQPValue, FieldTable, ShortString};
    use lapin::BasicProperties;

    fn settings(x_delay: XDelay) -> Settings {
        Settings {
            exchange: "x".into(),
            queue: "q".into(),
            queue_type: QueueType::Classic,
            prefetch: 10,
            batch_size: 10,
            dead_letter_exchange: None,
            dead_letter_queue: None,
            max_message_size: None,
            x_delay,
            user_id: UserId::DropOthers,
            replica_wait: ReplicaWait {
                replicas: 0,
                timeout: std::time::Duration::from_secs(1),
                ack: ReplicaAck::Received,
            },
            tenant_header: None,
        }
    }

    fn entry(props: &BasicProperties) -> Entry {
        let bin = gen_properties(props)(Vec::new().into()).unwrap().write;
        Entry {
            due_ms: 1_800_000_000_000,
            reference: "g1oAAw==".into(),
            routing_key: b"order.created".to_vec(),
            properties: bin,
            body: b"\x00body\xff".to_vec(),
        }
    }

    fn with_delay(ms: i32) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(ms));
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn the_envelope_is_what_the_intake_stores_for_the_same_publish() {
        let props = with_delay(60_000).with_message_id(ShortString::from("order-42"));
        let m = prepare(
            "rabbit@a",
            &entry(&props),
            &settings(XDelay::AsPublished),
            None,
        )
        .unwrap();
        let e = envelope::decode(&m.envelope).unwrap();
        assert_eq!(e.routing_key, "order.created");
        assert_eq!(e.body, b"\x00body\xff");
        assert_eq!(e.properties, props);
        assert_eq!(m.id, b"order-42");
        assert_eq!(m.due_ms, 1_800_000_000_000);
    }

    #[test]
    fn negated_x_delay_is_negated_as_the_intake_does() {
        let m = prepare(
            "n",
            &entry(&with_delay(5000)),
            &settings(XDelay::Negated),
            None,
        )
        .unwrap();
        let e = envelope::decode(&m.envelope).unwrap();
        let h = e.properties.headers().clone().unwrap();
        assert_eq!(
            h.inner().get("x-delay"),
            Some(&AMQPValue::LongLongInt(-5000))
        );
    }

    #[test]
    fn without_message_id_the_id_is_the_entry_name_stable_per_node_ref_and_due_time() {
        let e = entry(&with_delay(1000));
        let s = settings(XDelay::AsPublished);
        let a = prepare("rabbit@a", &e, &s, None).unwrap();
        assert_eq!(a.id, a.name.as_bytes());
        assert_eq!(a.name.len(), 32);
        assert_eq!(a, prepare("rabbit@a", &e, &s, None).unwrap());
        assert_ne!(a.name, prepare("rabbit@b", &e, &s, None).unwrap().name);
        let mut later = e.clone();
        later.due_ms += 1;
        assert_ne!(a.name, prepare("rabbit@a", &later, &s, None).unwrap().name);
        let mut other = e.clone();
        other.reference = "g1oAAx==".into();
        assert_ne!(a.name, prepare("rabbit@a", &other, &s, None).unwrap().name);
    }

    #[test]
    fn what_cannot_be_carried_is_named() {
        let mut e = entry(&with_delay(1000));
        e.routing_key = vec![0xff];
        let err = prepare("n", &e, &settings(XDelay::AsPublished), None).unwrap_err();
        assert!(err.contains("routing key"), "{err}");
        e.routing_key = b"rk".to_vec();
        e.properties = vec![0xff];
        let err = prepare("n", &e, &settings(XDelay::AsPublished), None).unwrap_err();
        assert!(err.contains("properties"), "{err}");
    }
}
