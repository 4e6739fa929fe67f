//! The intake where the broker or Redis stand in its way, on private
//! servers: a Redis restart and a RabbitMQ restart while messages published
//! with `x-delay` are being taken in lose none of them; a resource alarm
//! does not stop the intake; a producer's `user_id` does not stop delivery.
//! (`kill -9` of delayd mid-intake is in `tests/intake.rs`.)

use delayd_test_support as common;

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
    let spec = intake_spec(&key, target, "retry_backoff = \"100ms\"\n", intake, "");
    (write_config(dir, redis_url, amqp_url, &[&spec]), key)
}

/// The business `delayed` on `key`, delivering to `target`, with
/// `business` lines, and its intake on `intake` with `more` lines.
fn intake_spec(key: &str, target: &str, business: &str, intake: &str, more: &str) -> BusinessSpec {
    BusinessSpec {
        name: "delayed".into(),
        key: key.into(),
        exchange: target.into(),
        routing_key: String::new(),
        extra: format!(
            "properties = \"standard\"\n{business}[businesses.delayed.intake]\nexchange = \"{intake}\"\nqueue = \"{intake}.q\"\n{more}"
        ),
    }
}

/// A durable direct target with one durable queue bound by "" (the
/// producers' routing key).
async fn target(ch: &Channel, name: &str, queue: &str) {
    declare(ch, name, queue, "").await;
}

/// On the shared broker, a consumed [`target`] named for `prefix`, and a
/// name for the intake: (connection, channel, [target, queue, intake], inbox).
async fn consumed_target(prefix: &str) -> (Connection, Channel, [String; 3], Inbox) {
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let names = ["target", "q", "intake"].map(|s| unique(&format!("{prefix}-{s}")));
    target(&ch, &names[0], &names[1]).await;
    let inbox = consume(&amqp, &names[1]).await;
    (amqp, ch, names, inbox)
}

/// Deletes what [`target`] and the intake declared on the shared broker.
async fn remove_topology(ch: &Channel, target: &str, queue: &str, intake: &str) {
    let intake_queue = format!("{intake}.q");
    delete_topology(ch, &[queue, &intake_queue], &[target, intake]).await;
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
    let mut server = tokio::task::block_in_place(|| PrivateRedis::started(dir.path()));
    let (amqp, ch, [tgt, queue, intake], inbox) = consumed_target("rr").await;
    let (config, _) = intake_config(dir.path(), &server.url(), &amqp_url(), &tgt, &intake);
    let d = Daemon::start(&config);
    // Producers switch once the intake queue is bound and consumed, as the
    // migration guide says: before, the exchange may route to no queue yet.
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
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
    remove_topology(&ch, &tgt, &queue, &intake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_restart_mid_intake_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = PrivateRabbit::started(dir.path(), "").await;
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
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
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

/// A resource alarm makes RabbitMQ block every connection that publishes,
/// and with it everything else that connection carries. The intake only
/// consumes, on a connection of its own, so while another business's
/// publishing is blocked it goes on moving what waits in its queue into
/// Redis (which relieves the broker); once the alarm clears everything is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intake_keeps_taking_in_while_the_broker_blocks_publishers() {
    let dir = tempfile::tempdir().unwrap();
    let node = PrivateRabbit::started(dir.path(), "").await;
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (tgt, queue, intake) = ("al-target", "al-q", "al-intake");
    target(&ch, tgt, queue).await;
    let inbox = consume(&amqp, queue).await;
    let key = unique("test:intake-alarm");
    let delayed = intake_spec(&key, tgt, "", intake, "prefetch = 50\n");
    // A business of producers that write to Redis: its publishing is what
    // the alarm blocks.
    let plain = BusinessSpec {
        name: "plain".into(),
        key: unique("test:plain-alarm"),
        exchange: tgt.into(),
        routing_key: String::new(),
        extra: String::new(),
    };
    let config = write_config(dir.path(), &redis_url(), &node.url(), &[&delayed, &plain]);
    // A first run declares the intake's exchange and queue; the messages
    // then wait in the queue while delayd is stopped.
    let mut d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
    d.signal(15);
    assert!(d.wait(Duration::from_secs(20)).success());
    let all = bodies("al", 2000);
    let want: HashSet<Vec<u8>> = all.iter().cloned().collect();
    publish_all(node.url(), intake.to_string(), all, Duration::ZERO).await;

    let alarm = Alarm(&node);
    alarm.raise().await;
    let mut redis = redis().await;
    schedule_due_now(&mut redis, &plain.key, "plain", 100).await;
    let d = Daemon::start(&config);
    let inflight = family(&key).inflight;
    let stored = |mut redis: redis::aio::MultiplexedConnection| {
        let (key, inflight) = (key.clone(), inflight.clone());
        async move { zcard_all(&mut redis, &[&key, &inflight]).await }
    };
    let taken = eventually(Duration::from_secs(30), || {
        let n = stored(redis.clone());
        async move { n.await == 2000 }
    })
    .await;
    assert!(
        taken,
        "{} of 2000 taken in during the alarm; log:\n{}",
        stored(redis.clone()).await,
        d.tail()
    );
    assert!(inbox.bodies().is_empty(), "delivered during the alarm");
    alarm.clear().await;
    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    del_family(&mut redis, &key).await;
    del_family(&mut redis, &plain.key).await;
}

/// Publishes `body` to `exchange` as `user` (password = user name) with
/// `user_id` set to that user and `x-delay: 200`, confirmed.
async fn publish_as(node: &PrivateRabbit, user: &str, exchange: &str, body: &[u8]) {
    let url = format!("amqp://{user}:{user}@127.0.0.1:{}/%2f", node.port);
    let conn = amqp_at(&url).await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut h = FieldTable::default();
    h.insert("x-delay".into(), AMQPValue::LongInt(200));
    let props = BasicProperties::default()
        .with_headers(h)
        .with_user_id(ShortString::from(user))
        .with_message_id(ShortString::from(unique("uid")));
    let confirm = ch
        .basic_publish(
            exchange.into(),
            "".into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "the intake refused {user}'s publish");
}

/// RabbitMQ checks `user_id` against the user of the connection that
/// publishes. A producer logged in as "shop" may set `user_id = "shop"`;
/// delayd, logged in as "guest", may publish it again only if "guest" has
/// the `impersonator` tag. By default the intake drops a `user_id` that is
/// not delayd's own, so the message is still delivered; with
/// `user_id = "keep"` and an impersonating delayd it arrives as published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_user_id_never_stops_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let node = PrivateRabbit::started(dir.path(), "").await;
    node.ctl(&["add_user", "shop", "shop"]).await;
    node.ctl(&["set_permissions", "-p", "/", "shop", ".*", ".*", ".*"])
        .await;
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (tgt, queue, intake) = ("uid-target", "uid-q", "uid-intake");
    target(&ch, tgt, queue).await;
    let inbox = consume(&amqp, queue).await;

    let (config, key) = intake_config(dir.path(), &redis_url(), &node.url(), tgt, intake);
    let mut d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
    publish_as(&node, "shop", intake, b"dropped").await;
    publish_as(&node, "guest", intake, b"own").await;
    let want: HashSet<Vec<u8>> = [b"dropped".to_vec(), b"own".to_vec()].into();
    wait_all(&inbox, &want, Duration::from_secs(20), &d).await;
    let user_of = |body: &[u8]| {
        let r = inbox.all().into_iter().find(|r| r.body == body).unwrap();
        r.properties.user_id().as_ref().map(|u| u.to_string())
    };
    assert_eq!(
        user_of(b"dropped"),
        None,
        "another user's user_id is dropped"
    );
    assert_eq!(
        user_of(b"own").as_deref(),
        Some("guest"),
        "delayd's own is kept"
    );
    assert!(
        d.logs().contains("user_id"),
        "the drop is logged:\n{}",
        d.tail()
    );
    d.signal(15);
    assert!(d.wait(Duration::from_secs(20)).success());

    node.ctl(&["set_user_tags", "guest", "administrator", "impersonator"])
        .await;
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("queue = \"{intake}.q\"\n"),
        &format!("queue = \"{intake}.q\"\nuser_id = \"keep\"\n"),
    );
    std::fs::write(&config, text).unwrap();
    let d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
    publish_as(&node, "shop", intake, b"kept").await;
    wait_all(
        &inbox,
        &[b"kept".to_vec()].into(),
        Duration::from_secs(20),
        &d,
    )
    .await;
    assert_eq!(user_of(b"kept").as_deref(), Some("shop"));
    del_family(&mut redis().await, &key).await;
}

/// Redis at its `maxmemory` under `noeviction` (what a growing backlog
/// reaches, and clears as deliveries drain) refuses the intake's writes
/// with OOM. That can clear, so it is no reason to reject: taking in
/// pauses, the messages wait in the intake queue, the pause shows in a
/// metric, and once Redis has room every message is stored, none rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_pauses_the_intake_and_rejects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::block_in_place(|| PrivateRedis::started(dir.path()));
    let mut r = server.conn().await;
    let (amqp, ch, [tgt, queue, intake], inbox) = consumed_target("oom").await;
    let (config, key) = intake_config(dir.path(), &server.url(), &amqp_url(), &tgt, &intake);
    let port = free_port(30000..32700, &[]);
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start_with_env(&config, &[("DELAYD_HTTP__LISTEN", listen.as_str())]);
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
    // Room for a few hundred of the messages below (each its own
    // `message_id`), no more.
    let used: String = query(&mut r, "INFO", "memory").await;
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let limit = used + 300_000;
    for (k, v) in [
        ("maxmemory-policy", "noeviction".to_string()),
        ("maxmemory", limit.to_string()),
    ] {
        let _: () = query(&mut r, "CONFIG", ("SET", k, v)).await;
    }
    let all: Vec<Vec<u8>> = (0..1000)
        .map(|i| {
            let mut b = format!("oom-{i:05}-").into_bytes();
            b.resize(250, b'x');
            b
        })
        .collect();
    let want: HashSet<Vec<u8>> = all.iter().cloned().collect();
    publish_all(amqp_url(), intake.clone(), all, Duration::ZERO).await;
    let full = eventually(Duration::from_secs(20), || async {
        d.logs().contains("OOM")
    })
    .await;
    assert!(full, "Redis never refused a write; log:\n{}", d.tail());
    let paused = eventually(Duration::from_secs(10), || async {
        http_get(port, "/metrics").is_some_and(|(_, m)| {
            m.lines().any(|l| {
                l.strip_prefix("delayd_intake_waiting_for_redis{business=\"delayed\"} ")
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > 0)
            })
        })
    })
    .await;
    assert!(
        zcard(&mut r, &key).await < 1000,
        "Redis had room for all: the test did not fill it"
    );
    // Room again, as when deliveries drain a backlog.
    let _: () = query(&mut r, "CONFIG", ("SET", "maxmemory", "0")).await;
    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    assert!(paused, "the pause was in the metric");
    assert!(d.logs().contains("taking in paused"), "{}", d.tail());
    let (_, metrics) = http_get(port, "/metrics").expect("metrics answer");
    assert!(
        !metrics.contains("delayd_intake_rejected_total{"),
        "nothing rejected:\n{metrics}"
    );
    assert_eq!(queue_depth(&amqp, &format!("{intake}.q")).await, 0);
    drop(d);
    remove_topology(&ch, &tgt, &queue, &intake).await;
}

/// Redis away for longer than RabbitMQ's `consumer_timeout`: the broker
/// closes the intake's channel and hands its unacknowledged deliveries out
/// again. The batch delayd was still trying to write on the closed channel
/// is dropped, not written: only the redelivered copies are stored, so
/// messages without a `message_id` (ids delayd assigns) arrive once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_channel_closed_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let node = PrivateRabbit::started(dir.path(), "[{rabbit, [{consumer_timeout, 2000}]}].").await;
    let mut server = tokio::task::block_in_place(|| PrivateRedis::started(dir.path()));
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let (tgt, queue, intake) = ("ct-target", "ct-q", "ct-intake");
    target(&ch, tgt, queue).await;
    let inbox = consume(&amqp, queue).await;
    let (config, _) = intake_config(dir.path(), &server.url(), &node.url(), tgt, intake);
    let d = Daemon::start(&config);
    wait_consumed_queue(&amqp, &format!("{intake}.q"), &d).await;
    tokio::task::block_in_place(|| server.stop());
    let producer = amqp.create_channel().await.unwrap();
    producer
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let all = bodies("ct", 50);
    for body in &all {
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongInt(0));
        producer
            .basic_publish(
                intake.into(),
                "".into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_headers(h),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // RabbitMQ looks at consumer timeouts about once a minute; then it
    // closes the channel and delayd consumes on a new one.
    let timed_out = eventually(Duration::from_secs(150), || async {
        d.logs().matches("consuming the intake queue").count() >= 2
    })
    .await;
    assert!(
        timed_out,
        "the broker never closed the channel; log:\n{}",
        d.tail()
    );
    tokio::task::block_in_place(|| server.start());
    let want: HashSet<Vec<u8>> = all.iter().cloned().collect();
    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    inbox.settle(Duration::from_secs(2)).await;
    let twice: Vec<_> = counts(&inbox)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(b, n)| (String::from_utf8_lossy(&b).into_owned(), n))
        .collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}
