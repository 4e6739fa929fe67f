//! The bench's one consumer: counts deliveries and, while asked to, the
//! lateness of each.

use super::*;

/// Counts deliveries and keeps the lateness of the ones that carry a due time.
#[derive(Clone, Default)]
pub(super) struct Counter {
    pub(super) received: Arc<AtomicU64>,
    pub(super) lateness_ms: Arc<Mutex<Vec<f64>>>,
    pub(super) record: Arc<std::sync::atomic::AtomicBool>,
    /// Lateness of the bodies that name a class (`late<due>-<letter>-...`,
    /// see [`class_in_body`]), with the class, for `--fair`.
    pub(super) classed_ms: Arc<Mutex<Vec<(u8, f64)>>>,
}

pub(super) fn wall_ms_f() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// A distinct body of `size` bytes (longer only if the tag needs it).
/// The due time of a lateness-phase body (`late<due>-...`), if it is one.
pub(super) fn due_in_body(body: &[u8]) -> Option<i64> {
    let rest = body.strip_prefix(b"late")?;
    let end = rest.iter().position(|b| *b == b'-')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// The class letter of a body `late<due>-<letter>-...`, if it names one:
/// which tenant class of `--fair` the member belongs to.
pub(super) fn class_in_body(body: &[u8]) -> Option<u8> {
    let rest = body.strip_prefix(b"late")?;
    let dash = rest.iter().position(|b| *b == b'-')?;
    let class = *rest.get(dash + 1)?;
    (class.is_ascii_alphabetic() && rest.get(dash + 2) == Some(&b'-')).then_some(class)
}

/// Consumes the bench queue without acks, counting deliveries and, while
/// asked to, recording each one's lateness.
pub(super) async fn start_consumer(
    amqp: &Connection,
    names: &Names,
    counter: &Counter,
) -> Result<(), BenchError> {
    let consumer_ch = consumer_channel(amqp, 2000).await?;
    let mut consumer = consumer_ch
        .basic_consume(
            names.queue.as_str().into(),
            "delayd-bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| fail("consume")(e.to_string()))?;
    let c = counter.clone();
    tokio::spawn(async move {
        while let Some(Ok(d)) = consumer.next().await {
            c.received.fetch_add(1, Ordering::Relaxed);
            if c.record.load(Ordering::Relaxed) {
                let header = d
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get("x-delayd-due").cloned());
                let due = match header {
                    Some(AMQPValue::LongLongInt(due)) => Some(due),
                    _ => due_in_body(&d.data),
                };
                if let Some(due) = due {
                    let late = wall_ms_f() - due as f64;
                    if let Some(class) = class_in_body(&d.data) {
                        if let Ok(mut v) = c.classed_ms.lock() {
                            v.push((class, late));
                        }
                    } else if let Ok(mut v) = c.lateness_ms.lock() {
                        v.push(late);
                    }
                }
            }
        }
    });

    Ok(())
}

/// Between two timed phases: let the consumer catch up, or empty the queue
/// when there is none, so every phase starts from the same state.
pub(super) async fn between_phases(
    ch: &lapin::Channel,
    names: &Names,
    counter: &Counter,
    no_consumer: bool,
) -> Result<(), BenchError> {
    if no_consumer {
        ch.queue_purge(names.queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .map_err(|e| fail("purge queue")(e.to_string()))?;
        // The broker deletes purged persistent messages in the background;
        // let that finish rather than time the next phase against it.
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        wait_consumed(counter, Duration::from_secs(60)).await;
    }
    Ok(())
}

pub(super) async fn wait_consumed(counter: &Counter, limit: Duration) {
    let start = Instant::now();
    let mut last = counter.received.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = counter.received.load(Ordering::Relaxed);
        if now == last || start.elapsed() > limit {
            return;
        }
        last = now;
    }
}

/// Opens a channel and declares the bench's exchange and its queue, bound
/// by the bench's routing key.
pub(super) async fn declare_bench_queue(
    amqp: &Connection,
    names: &Names,
) -> Result<lapin::Channel, BenchError> {
    let ch = amqp
        .create_channel()
        .await
        .map_err(|e| fail("channel")(e.to_string()))?;
    crate::amqp::declare_bound_queue(
        &ch,
        &names.exchange,
        &names.queue,
        &names.routing_key,
        FieldTable::default(),
    )
    .await
    .map_err(|e| fail("declare exchange and queue")(e.to_string()))?;
    Ok(ch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_one_letter_after_the_due_time() {
        assert_eq!(class_in_body(b"late1700-h-000000001-xx"), Some(b'h'));
        assert_eq!(due_in_body(b"late1700-h-000000001-xx"), Some(1700));
        // The drain bench's lateness bodies name no class.
        assert_eq!(class_in_body(b"late1700-000000001-xx"), None);
        assert_eq!(class_in_body(b"r1-000000001-xx"), None);
    }
}
