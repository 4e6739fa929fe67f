//! When an intake message is due, read from its headers as the
//! delayed-message plugin reads them.
//!
//! The plugin takes `x-delay` as a signed or unsigned integer, a float
//! (truncated) or a string of digits, in milliseconds, and delivers at once
//! a message whose delay is missing, not a number, or not positive. delayd
//! does the same, also reads decimal strings (`"1500.0"`), and puts no upper
//! bound on the delay (the plugin published anything past 2^32 − 1 ms at
//! once).
//!
//! AMQP 1.0 producers on RabbitMQ 4 set message annotations instead, which
//! reach 0-9-1 consumers such as delayd as `x-opt-*` headers: a relative
//! `x-opt-delivery-delay` (ms) or an absolute `x-opt-delivery-time` (epoch
//! ms), the names the plugin's commercial successor reads. When several are
//! set the first present wins, whatever its value: `x-delay` (what the
//! plugin read, so a migrated producer means exactly what it meant), then
//! `x-opt-delivery-delay`, then `x-opt-delivery-time`.

use lapin::types::{AMQPValue, FieldTable};

/// The latest due time delayd stores, epoch ms: 2^53, below which every
/// millisecond is exact in a Redis score (about the year 287,000).
pub const LATEST_MS: i64 = 1 << 53;

pub use crate::store::incoming::Due;

/// The header that holds the delay.
pub const X_DELAY: &str = "x-delay";
/// The header (an AMQP 1.0 message annotation) that holds a relative delay.
pub const X_DELIVERY_DELAY: &str = "x-opt-delivery-delay";
/// The header (an AMQP 1.0 message annotation) that holds an absolute time.
pub const X_DELIVERY_TIME: &str = "x-opt-delivery-time";

/// When a message with these headers is due: the first of `x-delay`,
/// `x-opt-delivery-delay` and `x-opt-delivery-time` that is present decides
/// (see the module doc for why in this order).
pub fn due_of(headers: Option<&FieldTable>) -> Due {
    let Some(h) = headers.map(|h| h.inner()) else {
        return Due::Now;
    };
    if let Some((name, v)) = [X_DELAY, X_DELIVERY_DELAY]
        .into_iter()
        .find_map(|name| h.get(name).map(|v| (name, v)))
    {
        return match millis(v) {
            Some(ms) if ms > 0 => Due::After(ms.min(LATEST_MS)),
            Some(_) => Due::Now,
            None => Due::Invalid(describe(name, v)),
        };
    }
    match h.get(X_DELIVERY_TIME) {
        // AMQP 1.0's timestamp reaches 0-9-1 consumers in seconds.
        Some(AMQPValue::Timestamp(s)) => Due::At((*s).min(LATEST_MS as u64 / 1000) as i64 * 1000),
        Some(v) => match millis(v) {
            Some(ms) if ms > 0 => Due::At(ms.min(LATEST_MS)),
            Some(_) => Due::Now,
            None => Due::Invalid(describe(X_DELIVERY_TIME, v)),
        },
        None => Due::Now,
    }
}

/// A header value read as whole milliseconds: integers as they are, floats
/// and numeric strings truncated toward zero; anything else is `None`.
pub fn millis(v: &AMQPValue) -> Option<i64> {
    let ms = match v {
        AMQPValue::ShortShortInt(n) => *n as i64,
        AMQPValue::ShortShortUInt(n) => *n as i64,
        AMQPValue::ShortInt(n) => *n as i64,
        AMQPValue::ShortUInt(n) => *n as i64,
        AMQPValue::LongInt(n) => *n as i64,
        AMQPValue::LongUInt(n) => *n as i64,
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::Float(f) => float_ms(*f as f64)?,
        AMQPValue::Double(f) => float_ms(*f)?,
        AMQPValue::LongString(s) => text_ms(s.as_bytes())?,
        AMQPValue::ShortString(s) => text_ms(s.as_str().as_bytes())?,
        _ => return None,
    };
    Some(ms)
}

fn float_ms(f: f64) -> Option<i64> {
    // Saturating: a float beyond i64, infinity included, is a very long
    // delay (or, negative, none), not an error; only NaN is not a number.
    (!f.is_nan()).then(|| f.trunc() as i64)
}

fn text_ms(bytes: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(bytes).ok()?.trim();
    if let Ok(n) = s.parse::<i64>() {
        return Some(n);
    }
    // Only plain decimals: "inf", "nan" and "1e3" are not what a producer
    // that writes milliseconds as text means.
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+'));
    if plain {
        float_ms(s.parse::<f64>().ok()?)
    } else {
        None
    }
}

/// A short description of an unusable value and its header, for the warning.
fn describe(header: &str, v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => format!(
            "{header}: the string {:?}",
            String::from_utf8_lossy(&s.as_bytes()[..s.as_bytes().len().min(40)])
        ),
        AMQPValue::ShortString(s) => format!("{header}: the string {:?}", s.as_str()),
        other => format!("{header}: a value of type {:?}", other.get_type()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{LongString, ShortString};

    fn with(key: &str, v: AMQPValue) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert(ShortString::from(key), v);
        t
    }

    fn delay(v: AMQPValue) -> Due {
        due_of(Some(&with(X_DELAY, v)))
    }

    #[test]
    fn every_integer_type_the_plugin_reads_is_a_delay() {
        assert_eq!(delay(AMQPValue::LongInt(5000)), Due::After(5000));
        assert_eq!(delay(AMQPValue::LongUInt(5000)), Due::After(5000));
        assert_eq!(delay(AMQPValue::ShortInt(300)), Due::After(300));
        assert_eq!(delay(AMQPValue::ShortUInt(300)), Due::After(300));
        assert_eq!(delay(AMQPValue::ShortShortUInt(7)), Due::After(7));
        assert_eq!(delay(AMQPValue::ShortShortInt(7)), Due::After(7));
        assert_eq!(
            delay(AMQPValue::LongLongInt(315_576_000_000)),
            Due::After(315_576_000_000),
            "ten years is a delay like any other"
        );
    }

    #[test]
    fn floats_and_numeric_strings_are_truncated_milliseconds() {
        assert_eq!(delay(AMQPValue::Double(1500.9)), Due::After(1500));
        assert_eq!(delay(AMQPValue::Float(250.5)), Due::After(250));
        assert_eq!(
            delay(AMQPValue::LongString(LongString::from("5000"))),
            Due::After(5000)
        );
        assert_eq!(
            delay(AMQPValue::LongString(LongString::from(" 1500.0 "))),
            Due::After(1500)
        );
    }

    #[test]
    fn missing_zero_and_negative_delays_are_now() {
        assert_eq!(due_of(None), Due::Now);
        assert_eq!(due_of(Some(&FieldTable::default())), Due::Now);
        assert_eq!(delay(AMQPValue::LongInt(0)), Due::Now);
        assert_eq!(delay(AMQPValue::LongLongInt(-5000)), Due::Now);
        assert_eq!(
            delay(AMQPValue::LongString(LongString::from("-1"))),
            Due::Now
        );
    }

    #[test]
    fn values_that_are_not_numbers_are_invalid() {
        for v in [
            AMQPValue::LongString(LongString::from("soon")),
            AMQPValue::LongString(LongString::from("1e3")),
            AMQPValue::LongString(LongString::from("")),
            AMQPValue::Boolean(true),
            AMQPValue::Double(f64::NAN),
            AMQPValue::Void,
            AMQPValue::FieldTable(FieldTable::default()),
        ] {
            assert!(matches!(delay(v.clone()), Due::Invalid(_)), "{v:?}");
        }
    }

    #[test]
    fn delivery_time_is_absolute_and_x_delay_wins() {
        let t = with(X_DELIVERY_TIME, AMQPValue::LongLongInt(1_900_000_000_000));
        assert_eq!(due_of(Some(&t)), Due::At(1_900_000_000_000));
        let t = with(X_DELIVERY_TIME, AMQPValue::Timestamp(1_900_000_000));
        assert_eq!(due_of(Some(&t)), Due::At(1_900_000_000_000));
        let mut t = with(X_DELIVERY_TIME, AMQPValue::LongLongInt(1_900_000_000_000));
        t.insert(X_DELAY.into(), AMQPValue::LongInt(10));
        assert_eq!(due_of(Some(&t)), Due::After(10));
    }

    #[test]
    fn delivery_delay_is_relative_like_x_delay() {
        let dd = |v| due_of(Some(&with(X_DELIVERY_DELAY, v)));
        // RabbitMQ 4 hands an AMQP 1.0 `long` annotation over as a signed 64-bit integer.
        assert_eq!(dd(AMQPValue::LongLongInt(1500)), Due::After(1500));
        assert_eq!(dd(AMQPValue::LongUInt(1500)), Due::After(1500));
        assert_eq!(dd(AMQPValue::LongString("250".into())), Due::After(250));
        assert_eq!(dd(AMQPValue::LongLongInt(0)), Due::Now);
        assert_eq!(dd(AMQPValue::LongLongInt(-5)), Due::Now);
        assert_eq!(dd(AMQPValue::LongLongInt(i64::MAX)), Due::After(LATEST_MS));
        assert_eq!(
            dd(AMQPValue::Boolean(true)),
            Due::Invalid("x-opt-delivery-delay: a value of type Boolean".into())
        );
    }

    #[test]
    fn x_delay_then_delivery_delay_then_delivery_time() {
        let mut t = with(X_DELIVERY_TIME, AMQPValue::LongLongInt(1_900_000_000_000));
        t.insert(X_DELIVERY_DELAY.into(), AMQPValue::LongLongInt(20));
        assert_eq!(due_of(Some(&t)), Due::After(20), "delay before time");
        t.insert(X_DELAY.into(), AMQPValue::LongInt(10));
        assert_eq!(due_of(Some(&t)), Due::After(10), "x-delay before both");
        // The first present decides even when its value is unusable or zero,
        // as an x-delay of 0 meant "at once" to the plugin.
        t.insert(X_DELAY.into(), AMQPValue::LongInt(0));
        assert_eq!(due_of(Some(&t)), Due::Now);
        let mut t = with(X_DELIVERY_DELAY, AMQPValue::LongString("soon".into()));
        t.insert(
            X_DELIVERY_TIME.into(),
            AMQPValue::LongLongInt(1_900_000_000_000),
        );
        assert_eq!(
            due_of(Some(&t)),
            Due::Invalid("x-opt-delivery-delay: the string \"soon\"".into())
        );
    }

    #[test]
    fn absurd_delays_are_capped_where_scores_stay_exact() {
        assert_eq!(
            delay(AMQPValue::LongLongInt(i64::MAX)),
            Due::After(LATEST_MS)
        );
        assert_eq!(delay(AMQPValue::Double(1e300)), Due::After(LATEST_MS));
    }

    #[test]
    fn infinity_and_1e300_both_mean_the_latest_due_time() {
        for v in [
            AMQPValue::Double(f64::INFINITY),
            AMQPValue::Double(1e300),
            AMQPValue::Float(f32::INFINITY),
            AMQPValue::Float(f32::MAX),
        ] {
            assert_eq!(delay(v.clone()), Due::After(LATEST_MS), "{v:?}");
        }
        assert_eq!(delay(AMQPValue::Double(f64::NEG_INFINITY)), Due::Now);
        assert_eq!(
            delay(AMQPValue::LongString(LongString::from("1".repeat(301)))),
            Due::After(LATEST_MS),
            "a 301-digit string too"
        );
    }
}
