//! The properties an intake message is delivered with: the producer's, as
//! published, except where a setting asks otherwise (`x-delay` negated) or
//! the broker would refuse them from delayd (another user's `user_id`).

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;

use super::delay::{self, Due};
use crate::config::intake_settings::{Settings, UserId, XDelay};

/// The delivered properties, and the `user_id` dropped from them, if any.
pub fn properties(
    settings: &Settings,
    own_user: Option<&str>,
    props: &BasicProperties,
    due: &Due,
) -> (BasicProperties, Option<ShortString>) {
    let mut out = props.clone();
    if let (XDelay::Negated, Due::After(ms)) = (settings.x_delay, due) {
        let mut headers: FieldTable = props.headers().clone().unwrap_or_default();
        headers.insert(delay::X_DELAY.into(), AMQPValue::LongLongInt(-ms));
        out = out.with_headers(headers);
    }
    match props.user_id() {
        Some(user) if settings.user_id == UserId::DropOthers && own_user != Some(user.as_str()) => {
            (without_user_id(&out), Some(user.clone()))
        }
        _ => (out, None),
    }
}

/// The header a quorum queue adds to each redelivery: a count of the intake
/// queue's deliveries to delayd, which would mislead the consumer of the
/// target (it is not theirs). The broker sets it, so no producer's value is
/// lost by dropping it.
const DELIVERY_COUNT: &str = "x-delivery-count";

/// Drops the intake queue's `x-delivery-count` from a redelivered message;
/// returns the count it dropped, when it was an integer.
pub fn drop_delivery_count(props: &mut BasicProperties) -> Option<i64> {
    let headers = props.headers().as_ref()?;
    let count = match headers.inner().get(DELIVERY_COUNT)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        _ => None,
    };
    let mut kept = headers.inner().clone();
    kept.retain(|key, _| key.as_str() != DELIVERY_COUNT);
    *props = props.clone().with_headers(kept.into());
    count
}

/// `p` with every property but `user_id` (lapin can set a property, not
/// unset one).
fn without_user_id(p: &BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default();
    // One line per property, so one left out (and lost on delivery) shows.
    macro_rules! copy {
        ($($get:ident => $set:ident),* $(,)?) => {$(
            if let Some(v) = p.$get() {
                out = out.$set(v.clone());
            }
        )*};
    }
    copy!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        headers => with_headers,
        delivery_mode => with_delivery_mode,
        priority => with_priority,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        expiration => with_expiration,
        message_id => with_message_id,
        timestamp => with_timestamp,
        kind => with_type,
        app_id => with_app_id,
        cluster_id => with_cluster_id,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(user_id: UserId) -> Settings {
        Settings {
            exchange: "x".into(),
            queue: "q".into(),
            queue_type: crate::config::intake_settings::QueueType::Classic,
            prefetch: 10,
            batch_size: 10,
            dead_letter_exchange: None,
            dead_letter_queue: None,
            max_message_size: None,
            x_delay: XDelay::AsPublished,
            user_id,
            replica_wait: crate::config::intake_settings::ReplicaWait {
                replicas: 0,
                timeout: std::time::Duration::from_secs(1),
                ack: crate::config::intake_settings::ReplicaAck::Received,
            },
            tenant_header: None,
        }
    }

    fn every_property(user: &str) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(5));
        BasicProperties::default()
            .with_content_type("a/b".into())
            .with_content_encoding("gzip".into())
            .with_headers(h)
            .with_delivery_mode(2)
            .with_priority(3)
            .with_correlation_id("c".into())
            .with_reply_to("r".into())
            .with_expiration("9".into())
            .with_message_id("m".into())
            .with_timestamp(7)
            .with_type("t".into())
            .with_user_id(user.into())
            .with_app_id("a".into())
            .with_cluster_id("k".into())
    }

    #[test]
    fn another_users_user_id_is_dropped_and_nothing_else() {
        let p = every_property("shop");
        let (out, dropped) =
            properties(&settings(UserId::DropOthers), Some("guest"), &p, &Due::Now);
        assert_eq!(dropped.as_ref().map(|u| u.as_str()), Some("shop"));
        assert_eq!(out.user_id(), &None);
        assert_eq!(
            out.with_user_id("shop".into()),
            p,
            "every other property is kept"
        );
    }

    #[test]
    fn delayds_own_user_id_or_keep_leaves_the_properties_as_published() {
        let p = every_property("guest");
        let own = properties(&settings(UserId::DropOthers), Some("guest"), &p, &Due::Now);
        assert_eq!(own, (p.clone(), None));
        let other = every_property("shop");
        let kept = properties(&settings(UserId::Keep), Some("guest"), &other, &Due::Now);
        assert_eq!(kept, (other, None));
    }

    #[test]
    fn a_redeliverys_delivery_count_is_dropped_and_every_other_header_kept() {
        let mut p = every_property("guest");
        let mut h = p.headers().clone().unwrap();
        h.insert(DELIVERY_COUNT.into(), AMQPValue::LongLongInt(7));
        p = p.with_headers(h);
        assert_eq!(drop_delivery_count(&mut p), Some(7));
        assert_eq!(p, every_property("guest"));
    }

    #[test]
    fn with_delayds_user_unknown_every_user_id_is_dropped_by_default() {
        let p = every_property("guest");
        let (_, dropped) = properties(&settings(UserId::DropOthers), None, &p, &Due::Now);
        assert!(dropped.is_some());
    }
}
