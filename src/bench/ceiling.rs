//! The ceiling: a plain confirmed publisher on the same broker.

use super::*;

/// A plain lapin publisher: confirms on, `window` publishes in flight per
/// channel, persistent and mandatory like delayd's. Without `format` it
/// sends no other property (the ceiling); with one, exactly the properties
/// delayd sends for that business. Its bodies are distinct, like the
/// members of a sorted set, and as large as the drain's. Returns messages/s.
pub(super) async fn raw_publish(
    amqp: &Connection,
    names: &Names,
    n: usize,
    size: usize,
    channels: usize,
    window: usize,
    format: Option<&config::Business>,
) -> Result<f64, BenchError> {
    let mut chans = Vec::new();
    for _ in 0..channels {
        let ch = confirm_channel(amqp).await?;
        chans.push(ch);
    }
    let start = Instant::now();
    let per = n.div_ceil(channels);
    let run = rand::random::<u32>();
    let mut tasks = Vec::new();
    for (i, ch) in chans.into_iter().enumerate() {
        let count = per.min(n.saturating_sub(i * per));
        let exchange = names.exchange.clone();
        let rk = names.routing_key.clone();
        let format = format.cloned();
        let key = names.key.clone();
        tasks.push(tokio::spawn(async move {
            let mut inflight = FuturesUnordered::new();
            for j in 0..count {
                let body = body_of(&format!("raw{run:08x}-{i}"), j, size);
                while inflight.len() >= window {
                    if let Some(r) = inflight.next().await {
                        r?;
                    }
                }
                let props = match &format {
                    None => BasicProperties::default().with_delivery_mode(2),
                    Some(b) => {
                        let claimed = Claimed {
                            member: body.clone(),
                            due_ms: wall_ms_f() as i64,
                            attempt: 1,
                            body: None,
                            tenant: None,
                        };
                        crate::message::properties(b, &key, &claimed, claimed.due_ms)
                    }
                };
                let mandatory = BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                };
                let to = (exchange.as_str(), rk.as_str());
                publish_confirmed(&ch, &mut inflight, to, mandatory, (&body, props)).await?;
            }
            drain_confirms(&ch, &mut inflight).await
        }));
    }
    join_publishers(tasks, "raw publisher").await?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
