//! The intake's state per business for the overview, beside delivery:
//! whether this instance consumes its queue, how deep the queue is, what it
//! takes in and rejects. All from this process's metrics: no Redis call.

use serde_json::{json, Value};

use crate::config::Business;
use crate::http::rates::Rates;
use crate::telemetry::METRICS;

/// `null` for a business without an intake; else its queue and state.
pub fn state(b: &Business, rates: &Rates) -> Value {
    let Some(i) = &b.intake else {
        return Value::Null;
    };
    let m = &METRICS.intake;
    let name = b.name.as_str();
    let consuming = m.consuming.with_label_values(&[name]).get() == 1;
    json!({
        "exchange": i.exchange,
        "queue": i.queue,
        "consuming": consuming,
        "queue_messages": m.queue_messages.with_label_values(&[name]).get(),
        "taken_in_total": m.stored.with_label_values(&[name]).get(),
        "taken_in_per_s": rates.taken_in_per_s,
        "rejected_total": rejected_total(name),
        "rejected_per_s": rates.rejected_per_s,
        "waiting_for_redis": m.waiting.with_label_values(&[name]).get(),
    })
}

/// Rejected intake messages of `business`, every reason summed.
fn rejected_total(business: &str) -> u64 {
    use prometheus::core::Collector;
    METRICS
        .intake
        .rejected
        .collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "business" && l.value() == business)
        })
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}
