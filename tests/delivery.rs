//! End-to-end delivery against real Redis and RabbitMQ, with the daemon
//! running as a child process exactly as users run it.

use delayd_test_support as common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use lapin::types::AMQPValue;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_bodies_arrive_byte_exact_with_the_promised_properties() {
    let b = BusinessSpec::with_extra("bin", "content_type = \"application/octet-stream\"");
    let mut s = Setup::new(&[&b]).await;
    let now = redis_now_ms(&mut s.redis).await;
    let bodies: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0u8, 159, 146, 150, 255, 0, 10],
        b"plain text".to_vec(),
        (0..=255u8).collect(),
        "h\u{e9}llo \u{1f600}".as_bytes().to_vec(),
    ];
    let items: Vec<(f64, Vec<u8>)> = bodies.iter().map(|m| (now as f64, m.clone())).collect();
    zadd_many(&mut s.redis, &b.key, &items).await;
    let _d = Daemon::start(&s.config);
    s.inboxes[0]
        .wait_for(bodies.len(), Duration::from_secs(20))
        .await;
    s.inboxes[0].settle(Duration::from_millis(300)).await;
    let got = s.inboxes[0].all();
    assert_eq!(got.len(), bodies.len());
    let got_bodies: HashSet<Vec<u8>> = got.iter().map(|r| r.body.clone()).collect();
    let want: HashSet<Vec<u8>> = bodies.into_iter().collect();
    assert_eq!(got_bodies, want, "bodies must arrive byte for byte");
    for r in &got {
        assert_eq!(r.delivery_mode, Some(2), "persistent by default");
        assert_eq!(r.content_type.as_deref(), Some("application/octet-stream"));
        assert_eq!(
            r.message_id.as_deref(),
            Some(delayd::message::message_id(&b.key, &r.body, r.due()).as_str())
        );
        assert!(matches!(
            r.headers.get("x-delayd-business"),
            Some(lapin::types::AMQPValue::LongString(s)) if s.to_string() == "bin"
        ));
        assert!(matches!(
            r.headers.get("x-delayd-attempt"),
            Some(lapin::types::AMQPValue::LongLongInt(1))
        ));
        assert_eq!(r.due(), now);
    }
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(5)).await;
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_message_has_its_facts_in_standard_properties_and_a_header_only_on_retries() {
    let b = BusinessSpec::with_extra("std", "properties = \"standard\"\nretry_backoff = \"1s\"");
    // Nothing is bound yet: the first publish comes back unroutable.
    let mut s = Setup::unbound(&[&b]).await;
    let now = redis_now_ms(&mut s.redis).await;
    let due = now - 1234;
    zadd_many(&mut s.redis, &b.key, &[(due as f64, b"retried".to_vec())]).await;
    let d = Daemon::start(&s.config);
    // Returned once, it waits in K for its second attempt.
    let rescheduled = eventually(Duration::from_secs(10), || {
        let mut c = s.redis.clone();
        let key = b.key.clone();
        async move {
            let score: Option<f64> = zscore(&mut c, &key, "retried").await;
            score.is_some_and(|sc| sc > now as f64)
        }
    })
    .await;
    assert!(rescheduled, "never retried; log:\n{}", d.tail());
    let queue = unique("q");
    let inbox = bind_and_consume(&s.amqp, &s.ch, &b, &queue).await;
    let now = redis_now_ms(&mut s.redis).await;
    zadd_many(&mut s.redis, &b.key, &[(now as f64, b"first".to_vec())]).await;
    inbox.wait_for(2, Duration::from_secs(20)).await;
    for r in inbox.all() {
        let p = &r.properties;
        assert_eq!(
            p.kind().as_ref().map(|s| s.as_str()),
            Some("std"),
            "type is the business"
        );
        assert_eq!(p.app_id().as_ref().map(|s| s.as_str()), Some("delayd"));
        assert_eq!(r.delivery_mode, Some(2));
        let attempt = r.headers.get("x-delayd-attempt");
        if r.body == b"retried" {
            assert_eq!(
                *p.timestamp(),
                Some((due / 1000) as u64),
                "timestamp is the due time"
            );
            assert_eq!(
                r.message_id.as_deref(),
                Some(delayd::message::message_id(&b.key, b"retried", due).as_str())
            );
            assert!(
                matches!(attempt, Some(AMQPValue::LongLongInt(2))),
                "a retry says which attempt it is: {attempt:?}"
            );
            assert_eq!(r.headers.len(), 1, "only the attempt: {:?}", r.headers);
        } else {
            assert_eq!(*p.timestamp(), Some((now / 1000) as u64));
            assert!(
                r.headers.is_empty(),
                "a first attempt carries no header table: {:?}",
                r.headers
            );
            assert!(p.headers().is_none());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_no_headers_keeps_the_message_id_and_bare_sends_nothing_else() {
    let b = BusinessSpec::with_extra("nohdr", "properties = \"no-headers\"");
    let bare = BusinessSpec::with_extra("bare", "properties = \"bare\"");
    let mut s = Setup::new(&[&b, &bare]).await;
    let now = redis_now_ms(&mut s.redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..20)
        .map(|i| (now as f64, format!("m{i}").into_bytes()))
        .collect();
    zadd_many(&mut s.redis, &b.key, &items).await;
    zadd_many(&mut s.redis, &bare.key, &items).await;
    let _d = Daemon::start(&s.config);
    for inbox in &s.inboxes {
        inbox.wait_for(items.len(), Duration::from_secs(20)).await;
        inbox.settle(Duration::from_millis(300)).await;
        assert_eq!(inbox.len(), items.len());
    }
    for r in &s.inboxes[0].all() {
        assert!(r.headers.is_empty(), "no headers expected: {:?}", r.headers);
        assert_eq!(r.delivery_mode, Some(2));
        assert_eq!(
            r.message_id.as_deref(),
            Some(delayd::message::message_id(&b.key, &r.body, now).as_str())
        );
    }
    for r in &s.inboxes[1].all() {
        assert!(r.headers.is_empty(), "no headers expected: {:?}", r.headers);
        assert_eq!(r.delivery_mode, Some(2));
        assert_eq!(r.message_id, None);
    }
    for key in [&b.key, &bare.key] {
        wait_drained(&mut s.redis, key, Duration::from_secs(5)).await;
        assert_family_empty(&mut s.redis, key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_businesses_each_reach_their_own_queue() {
    let a = BusinessSpec::random("alpha");
    let b = BusinessSpec::random("beta");
    let mut s = Setup::new(&[&a, &b]).await;
    let now = redis_now_ms(&mut s.redis).await as f64;
    let ia: Vec<(f64, Vec<u8>)> = (0..50)
        .map(|i| (now, format!("a{i}").into_bytes()))
        .collect();
    let ib: Vec<(f64, Vec<u8>)> = (0..70)
        .map(|i| (now, format!("b{i}").into_bytes()))
        .collect();
    zadd_many(&mut s.redis, &a.key, &ia).await;
    zadd_many(&mut s.redis, &b.key, &ib).await;
    let _d = Daemon::start(&s.config);
    s.inboxes[0].wait_for(50, Duration::from_secs(20)).await;
    s.inboxes[1].wait_for(70, Duration::from_secs(20)).await;
    s.inboxes[0].settle(Duration::from_millis(300)).await;
    assert!(s.inboxes[0].all().iter().all(|r| r.body.starts_with(b"a")));
    assert!(s.inboxes[1].all().iter().all(|r| r.body.starts_with(b"b")));
    assert_eq!(s.inboxes[0].len(), 50);
    assert_eq!(s.inboxes[1].len(), 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_not_yet_due_wait_and_arrive_on_time_never_early() {
    let b = BusinessSpec::random("ontime");
    let mut s = Setup::new(&[&b]).await;
    let _d = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = redis_now_ms(&mut s.redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..40)
        .map(|i| ((now + 1500 + i * 50) as f64, format!("m{i}").into_bytes()))
        .collect();
    zadd_many(&mut s.redis, &b.key, &items).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(s.inboxes[0].len(), 0, "nothing may arrive before it is due");
    assert_eq!(
        zcard(&mut s.redis, &b.key).await,
        40,
        "not-yet-due members stay in Redis"
    );
    s.inboxes[0].wait_for(40, Duration::from_secs(15)).await;
    for r in s.inboxes[0].all() {
        let i: i64 = String::from_utf8_lossy(&r.body[1..]).parse().unwrap();
        let due = now + 1500 + i * 50;
        assert_eq!(r.due(), due);
        // The consumer's clock is this machine's, as is Redis's here.
        assert!(r.at_ms >= due, "{} arrived {} ms early", i, due - r.at_ms);
        assert!(
            r.at_ms - due < 1000,
            "{} arrived {} ms late",
            i,
            r.at_ms - due
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescheduled_member_arrives_once_at_its_new_time() {
    let b = BusinessSpec::random("resched");
    let mut s = Setup::new(&[&b]).await;
    let _d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut s.redis).await;
    schedule_at(&mut s.redis, &b.key, now + 1000, &[b"moved"]).await;
    schedule_at(&mut s.redis, &b.key, now + 2500, &[b"moved"]).await;
    s.inboxes[0].wait_for(1, Duration::from_secs(10)).await;
    s.inboxes[0].settle(Duration::from_millis(1000)).await;
    let got = s.inboxes[0].all();
    assert_eq!(got.len(), 1, "delivered exactly once");
    assert_eq!(got[0].due(), now + 2500);
    assert!(got[0].at_ms >= now + 2500, "not before the new time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zrem_cancels_a_member() {
    let b = BusinessSpec::random("cancel");
    let mut s = Setup::new(&[&b]).await;
    let now = redis_now_ms(&mut s.redis).await;
    let _d = Daemon::start(&s.config);
    schedule_at(&mut s.redis, &b.key, now + 1200, &[b"cancelled", b"kept"]).await;
    let _: i64 = query(&mut s.redis, "ZREM", (&b.key, "cancelled")).await;
    s.inboxes[0].wait_for(1, Duration::from_secs(10)).await;
    s.inboxes[0].settle(Duration::from_millis(800)).await;
    let got = s.inboxes[0].all();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, b"kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_due_over_seconds_arrive_exactly_once_and_redis_ends_empty() {
    let a = BusinessSpec::random("bulk_a");
    let b = BusinessSpec::random("bulk_b");
    let mut s = Setup::new(&[&a, &b]).await;
    let _d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut s.redis).await;
    let n = 3000i64;
    let make = |tag: u8| -> Vec<(f64, Vec<u8>)> {
        (0..n)
            .map(|i| {
                let mut body = vec![tag, 0xff, 0x00];
                body.extend_from_slice(&i.to_le_bytes());
                ((now + 500 + (i * 3000) / n) as f64, body)
            })
            .collect()
    };
    let (ia, ib) = (make(b'a'), make(b'b'));
    zadd_many(&mut s.redis, &a.key, &ia).await;
    zadd_many(&mut s.redis, &b.key, &ib).await;
    s.inboxes[0]
        .wait_for(n as usize, Duration::from_secs(60))
        .await;
    s.inboxes[1]
        .wait_for(n as usize, Duration::from_secs(60))
        .await;
    s.inboxes[0].settle(Duration::from_millis(500)).await;
    for (inbox, items) in [(&s.inboxes[0], &ia), (&s.inboxes[1], &ib)] {
        let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
        let got = inbox.assert_each_once(&want, "a steady drain");
        for r in &got {
            assert!(r.at_ms >= r.due(), "arrived early");
        }
    }
    for k in [&a.key, &b.key] {
        wait_drained(&mut s.redis, k, Duration::from_secs(5)).await;
        assert_family_empty(&mut s.redis, k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_unit_seconds_is_honoured() {
    let b = BusinessSpec::with_extra("secs", "score_unit = \"s\"");
    let mut s = Setup::new(&[&b]).await;
    let _d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut s.redis).await;
    let due_s = (now + 1500) as f64 / 1000.0;
    zadd_many(&mut s.redis, &b.key, &[(due_s, b"in-seconds".to_vec())]).await;
    s.inboxes[0].wait_for(1, Duration::from_secs(10)).await;
    let r = &s.inboxes[0].all()[0];
    assert!(r.at_ms >= now + 1500, "arrived early");
    assert!(
        r.at_ms < now + 2500,
        "arrived {} ms late",
        r.at_ms - now - 1500
    );
    assert_eq!(r.due(), now + 1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_drain_exits_zero_and_a_restart_delivers_the_rest_without_duplicates() {
    let b = BusinessSpec::with_extra("term", "max_rate = 2000");
    let mut s = Setup::new(&[&b]).await;
    let n = 8000usize;
    let items = schedule_due_now(&mut s.redis, &b.key, "t", n).await;
    let mut d = Daemon::start(&s.config);
    s.inboxes[0].wait_for(1000, Duration::from_secs(20)).await;
    d.signal(15);
    let status = d.wait(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "log:\n{}", d.logs());
    let first = s.inboxes[0].len();
    assert!(first < n, "the drain should have been interrupted");
    let f = family(&b.key);
    assert_eq!(
        zcard(&mut s.redis, &f.inflight).await,
        0,
        "a clean stop leaves nothing in flight"
    );
    let mut d2 = Daemon::start(&s.config);
    s.inboxes[0].wait_for(n, Duration::from_secs(30)).await;
    s.inboxes[0].settle(Duration::from_millis(500)).await;
    let want = items.into_iter().map(|(_, m)| m).collect();
    s.inboxes[0].assert_each_once(&want, "a clean stop");
    d2.signal(15);
    assert_eq!(d2.wait(Duration::from_secs(15)).code(), Some(0));
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_delivers_every_member() {
    let b = BusinessSpec::with_extra("kill", "lease = \"2s\"\nmax_rate = 2000");
    let mut s = Setup::new(&[&b]).await;
    let now = redis_now_ms(&mut s.redis).await as f64;
    let n = 6000usize;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| (now, format!("k{i}").into_bytes()))
        .collect();
    zadd_many(&mut s.redis, &b.key, &items).await;
    let mut d = Daemon::start(&s.config);
    s.inboxes[0].wait_for(1000, Duration::from_secs(20)).await;
    d.kill();
    let _d2 = Daemon::start(&s.config);
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(30)).await;
    s.inboxes[0].settle(Duration::from_millis(500)).await;
    let set: HashSet<Vec<u8>> = s.inboxes[0].all().iter().map(|r| r.body.clone()).collect();
    assert_eq!(
        set.len(),
        n,
        "every member delivered at least once after SIGKILL"
    );
    // A recovered member keeps its original due time, so a consumer can
    // de-duplicate the redelivery by message_id.
    for r in s.inboxes[0].all() {
        assert_eq!(r.due(), now as i64, "due time changed by the recovery");
        assert_eq!(
            r.message_id.as_deref(),
            Some(delayd::message::message_id(&b.key, &r.body, now as i64).as_str())
        );
    }
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_future_writes_cost_no_claims_and_a_due_write_still_goes_out_at_once() {
    // A private server, so the counts are delayd's and this test's alone.
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let b = BusinessSpec::random("farwrites");
    let mut s = Setup::on(&redis_server.url(), &amqp_url(), &[&b]).await;
    let _d = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let _: () = query(&mut s.redis, "CONFIG", "RESETSTAT").await;
    // 600 producer writes (ZADDs, each one keyspace event) due in a week,
    // one every 5 ms, and one write due now in the middle of them.
    let week = 7 * 86_400_000;
    let mut writes = 0u64;
    let mut sent_due_at = None;
    for round in 0..600 {
        let now = redis_now_ms(&mut s.redis).await;
        let items: Vec<(f64, Vec<u8>)> = (0..5)
            .map(|i| ((now + week) as f64, format!("far-{round}-{i}").into_bytes()))
            .collect();
        zadd_many(&mut s.redis, &b.key, &items).await;
        writes += 1;
        if round == 300 {
            zadd_many(&mut s.redis, &b.key, &[(now as f64, b"due-now".to_vec())]).await;
            sent_due_at = Some(wall_ms());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (claims, _) = command_stats(&mut s.redis, "evalsha").await;
    let (zadds, _) = command_stats(&mut s.redis, "zadd").await;
    assert!(zadds >= writes, "{zadds} ZADDs counted for {writes} writes");
    // A claim per write would be ~600; the due write and the watchdog
    // need a handful.
    assert!(
        claims <= 20,
        "{claims} claim calls for {writes} far-future writes"
    );
    s.inboxes[0].wait_for(1, Duration::from_secs(5)).await;
    let got = s.inboxes[0].all();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, b"due-now");
    let late = got[0].at_ms - sent_due_at.unwrap();
    assert!(
        late < 1000,
        "the due write went out {late} ms after it was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_redis_is_frozen_never_puts_a_confirmed_member_back() {
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let b = BusinessSpec::with_extra("frozen", "shutdown_timeout = \"3s\"");
    let mut s = Setup::on(&redis_server.url(), &amqp_url(), &[&b]).await;
    let n = 30_000usize;
    schedule_due_now(&mut s.redis, &b.key, "f", n).await;
    let mut d = Daemon::start(&s.config);
    s.inboxes[0].wait_for(2000, Duration::from_secs(20)).await;
    // Redis stops answering mid-drain and delayd is told to stop; Redis
    // comes back 4.5 s later, after the 3 s shutdown_timeout, while delayd
    // still writes what it owes.
    redis_server.signal("STOP");
    d.signal(15);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    redis_server.signal("CONT");
    let status = d.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "log:\n{}", d.tail());
    s.inboxes[0].settle(Duration::from_millis(1000)).await;
    let delivered = s.inboxes[0].bodies();
    let f = family(&b.key);
    let pending: Vec<Vec<u8>> = zrange(&mut s.redis, &b.key).await;
    let inflight: Vec<Vec<u8>> = zrange(&mut s.redis, &f.inflight).await;
    let both: Vec<&Vec<u8>> = pending.iter().filter(|m| delivered.contains(*m)).collect();
    assert!(
        both.is_empty(),
        "{} members were delivered and put back as pending (each would go out twice); log:\n{}",
        both.len(),
        d.tail()
    );
    let accounted = delivered.len() + pending.len() + inflight.len();
    assert!(
        accounted >= n,
        "{} members neither delivered nor in Redis",
        n - accounted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_within_their_bound_while_redis_is_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let mut b = BusinessSpec::random("scrape");
    // Four keys, each read for the gauges.
    b.extra = "shards = 4".into();
    let c = Consumers::on(&amqp_url(), &[&b]).await;
    let port = free_port(10000..15000, &[]);
    let config = write_config_with(
        c.dir.path(),
        &redis_server.url(),
        &format!("url = \"{}\"", amqp_url()),
        &format!("127.0.0.1:{port}"),
        &[&b],
    );
    let d = Daemon::start(&config);
    assert!(
        eventually(Duration::from_secs(10), || async {
            tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
                .await
                .unwrap()
                .is_some_and(|(code, body)| code == 200 && body.contains("delayd_pending"))
        })
        .await,
        "no metrics; log:\n{}",
        d.tail()
    );
    redis_server.signal("STOP");
    let start = std::time::Instant::now();
    let got = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .unwrap();
    let took = start.elapsed();
    redis_server.signal("CONT");
    assert!(matches!(got, Some((200, _))), "{got:?}");
    assert!(
        took < Duration::from_secs(4),
        "a scrape took {took:?} with Redis frozen"
    );
}

/// RabbitMQ 4 deprecates transient non-exclusive queues and global QoS for
/// 0-9-1 clients; the shared node of each RabbitMQ 4 server set denies both
/// (`deploy/local/rabbitmq-lib.sh`), so every test that passes there shows
/// that neither delayd nor its tests rely on them. This checks the denial
/// is in force (global QoS, when denied, is accepted and ignored, so only
/// the queue can be checked from a client).
#[tokio::test]
async fn the_rabbitmq_4_test_brokers_deny_transient_non_exclusive_queues() {
    if RawAmqp::connect(&amqp_url()).await.rabbitmq_major() < 4 {
        return;
    }
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let queue = unique("transient");
    let declared = ch
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await;
    let err = declared.expect_err("RabbitMQ 4 took a transient non-exclusive queue");
    assert!(
        err.to_string().contains("transient_nonexcl_queues"),
        "refused for another reason: {err}"
    );
}
