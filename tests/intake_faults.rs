//! The intake under faults, on private servers: a Redis restart and a
//! RabbitMQ restart while messages published with `x-delay` are being taken
//! in lose none of them. (`kill -9` of delayd mid-intake is in
//! `tests/intake.rs`.)

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};

/// An intake business on `redis_url` and `amqp_url`, delivering to
/// `target`; returns the config's path and the business's key.
fn intake_config(
    dir: &std::path::Path,
    redis_url: &str,
    amqp_url: &str,
    target: &str,
    intake: &str,
) -> (std::path::PathBuf, String) {
    let key = unique("test:intake-fault");
    let spec = BusinessSpec {
        name: "delayed".into(),
        key: key.clone(),
        exchange: target.into(),
        routing_key: String::new(),
        extra: format!(
            "properties = \"standard\"\nretry_backoff = \"100ms\"\n[businesses.delayed.intake]\nexchange = \"{intake}\"\nqueue = \"{intake}.q\"\n"
        ),
    };
    (write_config(dir, redis_url, amqp_url, &[&spec]), key)
}

/// A durable direct target with one durable queue bound by "" (the
/// producers' routing key).
async fn target(ch: &Channel, name: &str, queue: &str) {
    declare(ch, name, queue, "").await;
}

/// Publishes `bodies` with `x-delay` and a `message_id` each, confirmed,
/// pacing one every `every`; a publish the broker refuses (it is away) is
/// tried again on a new connection until `deadline`.
async fn publish_all(url: String, exchange: String, bodies: Vec<Vec<u8>>, every: Duration) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut conn: Option<(Connection, Channel)> = None;
    for body in bodies {
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "could not publish in 90 s"
            );
            if conn.is_none() {
                if let Ok(Ok(c)) = tokio::time::timeout(
                    Duration::from_secs(2),
                    Connection::connect(&url, Default::default()),
                )
                .await
                {
                    if let Ok(ch) = c.create_channel().await {
                        if ch
                            .confirm_select(ConfirmSelectOptions::default())
                            .await
                            .is_ok()
                        {
                            conn = Some((c, ch));
                        }
                    }
                }
            }
            let Some((_, ch)) = &conn else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut h = FieldTable::default();
            h.insert("x-delay".into(), AMQPValue::LongInt(1500));
            let props = BasicProperties::default()
                .with_headers(h)
                .with_delivery_mode(2)
                .with_message_id(ShortString::from(
                    String::from_utf8_lossy(&body).to_string(),
                ));
            let sent = match ch
                .basic_publish(
                    exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
            {
                Ok(confirm) => matches!(
                    tokio::time::timeout(Duration::from_secs(5), confirm).await,
                    Ok(Ok(c)) if c.is_ack()
                ),
                Err(_) => false,
            };
            if sent {
                break;
            }
            conn = None;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(every).await;
    }
}

fn bodies(tag: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{tag}-{i:05}").into_bytes())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_intake_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = PrivateRedis::new(dir.path());
    tokio::task::block_in_place(|| server.start());
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (tgt, queue, intake) = (unique("rr-target"), unique("rr-q"), unique("rr-intake"));
    target(&ch, &tgt, &queue).await;
    let inbox = consume(&amqp, &queue).await;
    let (config, _) = intake_config(dir.path(), &server.url(), &amqp_url(), &tgt, &intake);
    let d = Daemon::start(&config);
    let all = bodies("rr", 1500);
    let want: HashSet<Vec<u8>> = all.iter().cloned().collect();
    let publisher = tokio::spawn(publish_all(
        amqp_url(),
        intake.clone(),
        all,
        Duration::from_millis(2),
    ));
    // Redis goes away for 3 s while messages keep arriving.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    tokio::task::block_in_place(|| server.stop());
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| server.start());
    publisher.await.unwrap();
    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .queue_delete(
            format!("{intake}.q").as_str().into(),
            QueueDeleteOptions::default(),
        )
        .await;
    for x in [&tgt, &intake] {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_restart_mid_intake_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = PrivateRabbit::new(dir.path());
    node.start().await;
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (tgt, queue, intake) = ("br-target", "br-q", "br-intake");
    target(&ch, tgt, queue).await;
    // Acknowledging consumer: what it has not recorded stays in the durable
    // queue across the restart.
    let inbox = Inbox::default();
    consume_into(&amqp, queue, &inbox, true).await;
    let (config, key) = intake_config(dir.path(), &redis_url(), &node.url(), tgt, intake);
    let d = Daemon::start(&config);
    let all = bodies("br", 1500);
    let want: HashSet<Vec<u8>> = all.iter().cloned().collect();
    let publisher = tokio::spawn(publish_all(
        node.url(),
        intake.to_string(),
        all,
        Duration::from_millis(2),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    node.stop().await;
    drop(ch);
    drop(amqp);
    tokio::time::sleep(Duration::from_secs(3)).await;
    node.start().await;
    let amqp = amqp_at(&node.url()).await;
    consume_into(&amqp, queue, &inbox, true).await;
    publisher.await.unwrap();
    wait_all(&inbox, &want, Duration::from_secs(90), &d).await;
    del_family(&mut redis().await, &key).await;
}
