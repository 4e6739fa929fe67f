//! Faults: crashes, server restarts, a broker that refuses, hostile members
//! and servers that are not there yet. Real Redis and RabbitMQ throughout;
//! tests that stop a server run their own (private port and directory), so
//! they never disturb the shared servers or the other tests.

use delayd_test_support as common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use lapin::types::{AMQPValue, FieldTable, LongString};

/// Panics with the daemon's log unless it is still running.
fn assert_running(d: &mut Daemon) {
    if let Some(status) = d.child.try_wait().unwrap() {
        panic!("delayd exited ({status}); log:\n{}", d.tail());
    }
}

/// Distinct members, `now_count` due at `now`, the rest spread evenly over
/// `spread_ms` after `now + offset_ms`.
fn flow(
    tag: &str,
    n: usize,
    now_count: usize,
    now: i64,
    offset_ms: i64,
    spread_ms: i64,
) -> Vec<(f64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let due = if i < now_count {
                now
            } else {
                now + offset_ms + (i - now_count) as i64 * spread_ms / (n - now_count).max(1) as i64
            };
            (due as f64, format!("{tag}-{i}").into_bytes())
        })
        .collect()
}

/// Waits until a fifth of the `n` members arrived, asserts the flow is
/// under way (some but not all delivered) when `server` stops.
async fn wait_under_way(inbox: &Inbox, n: usize, server: &str, d: &Daemon) {
    inbox.wait_for(n / 5, Duration::from_secs(30)).await;
    let before = inbox.len();
    assert!(
        before > 0 && before < n,
        "the flow should be under way when {server} stops ({before} of {n} delivered); log:\n{}",
        d.tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_repeatedly_during_a_flow_loses_nothing() {
    let b = BusinessSpec::with_extra("kills", "lease = \"2s\"");
    let s = Setup::new(&[&b]).await;
    let (config, inbox, mut redis) = (&s.config, s.inbox().clone(), s.redis.clone());

    // 20k members: half due now (a backlog), half due over the next 6 s.
    let n = 20_000;
    let now = redis_now_ms(&mut redis).await;
    let items = flow("kill", n, n / 2, now, 500, 6000);
    zadd_many(&mut redis, &b.key, &items).await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();

    // Four SIGKILLs at random points of the flow, each after a random share
    // of the members has arrived and a random pause after the last start.
    let mut points: Vec<usize> = (0..4)
        .map(|_| rand::random_range(n / 20..n * 3 / 4))
        .collect();
    points.sort();
    let mut d = Daemon::start(config);
    for (i, point) in points.iter().enumerate() {
        let started = Instant::now();
        let pause = Duration::from_millis(rand::random_range(200..1200));
        wait_n(&inbox, *point, Duration::from_secs(60), &d).await;
        tokio::time::sleep(pause.saturating_sub(started.elapsed())).await;
        d.kill();
        let delivered = inbox.bodies().len();
        assert!(delivered < n, "kill {i} came after the flow had ended");
        d = Daemon::start(config);
    }

    wait_drained(&mut redis, &b.key, Duration::from_secs(120)).await;
    wait_all(&inbox, &want, Duration::from_secs(30), &d).await;
    assert_eq!(inbox.bodies(), want, "nothing but the scheduled members");
    // What the killed processes left goes within a lease plus a sweep (2 s each).
    wait_family_empty(&mut redis, &b.key, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_flow_loses_nothing_and_resumes_within_10s() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = tokio::task::block_in_place(|| PrivateRedis::started(dir.path()));
    let b = BusinessSpec::random("redis_restart");
    let s = Setup::on(&server.url(), &amqp_url(), &[&b]).await;
    let (config, inbox, mut rc) = (&s.config, s.inbox().clone(), s.redis.clone());
    let mut d = Daemon::start(config);

    let n = 3000;
    let now = redis_now_ms(&mut rc).await;
    let items = flow("rr", n, 0, now, 500, 6000);
    zadd_many(&mut rc, &b.key, &items).await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();

    // Stop Redis about 2 s into the flow, keep it away 3 s, restart it.
    wait_under_way(&inbox, n, "Redis", &d).await;
    tokio::task::block_in_place(|| server.stop());
    drop(rc);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_running(&mut d);
    tokio::task::block_in_place(|| server.start());
    let restarted = wall_ms();

    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    let first_after = inbox
        .all()
        .iter()
        .map(|r| r.at_ms)
        .filter(|at| *at >= restarted)
        .min()
        .expect("members were due after the restart");
    eprintln!(
        "delivery resumed {} ms after Redis came back",
        first_after - restarted
    );
    assert!(
        first_after - restarted < 10_000,
        "delivery resumed {} ms after Redis came back; log:\n{}",
        first_after - restarted,
        d.tail()
    );
    assert_running(&mut d);
    let mut rc = server.conn().await;
    wait_drained(&mut rc, &b.key, Duration::from_secs(60)).await;
    // A claim whose reply was lost with the restart leaves its record until
    // a recovery or the sweep (a lease plus a sweep interval, 30 s each).
    wait_family_empty(&mut rc, &b.key, Duration::from_secs(75)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_restart_mid_flow_loses_nothing_and_resumes_within_10s() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = PrivateRabbit::started(dir.path(), "").await;
    let b = BusinessSpec::random("rabbit_restart");
    let queue = unique("q");
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    declare(&ch, &b.exchange, &queue, &b.routing_key).await;
    // Acknowledging consumer: what it has not recorded stays in the durable
    // queue across the restart.
    let inbox = Inbox::default();
    consume_into(&amqp, &queue, &inbox, true).await;
    let config = write_config(dir.path(), &redis_url(), &node.url(), &[&b]);
    let mut redis = redis().await;
    let mut d = Daemon::start(&config);

    let n = 3000;
    let now = redis_now_ms(&mut redis).await;
    let mut items = flow("br", n, 0, now, 500, 6000);
    zadd_many(&mut redis, &b.key, &items).await;

    // Stop the broker about 2 s into the flow, keep it away 3 s, restart it.
    wait_under_way(&inbox, n, "RabbitMQ", &d).await;
    node.stop().await;
    let gone = wall_ms();
    drop(ch);
    drop(amqp);
    // Scheduled while the broker is away: these can only be published after
    // it is back, whatever else happens to be in the queue.
    let now = redis_now_ms(&mut redis).await;
    let late: Vec<(f64, Vec<u8>)> = (0..200)
        .map(|i| (now as f64, format!("br-late-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &late).await;
    items.extend(late);
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_running(&mut d);
    node.start().await;
    let back = wall_ms();
    let amqp = amqp_at(&node.url()).await;
    consume_into(&amqp, &queue, &inbox, true).await;

    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    // A message due after the broker went down cannot have been published
    // before it came back.
    let first_new = inbox
        .all()
        .iter()
        .filter(|r| r.due() >= gone)
        .map(|r| r.at_ms)
        .min()
        .expect("members were due after the stop");
    eprintln!(
        "delivery resumed {} ms after RabbitMQ came back",
        first_new - back
    );
    assert!(
        first_new - back < 10_000,
        "delivery resumed {} ms after RabbitMQ came back; log:\n{}",
        first_new - back,
        d.tail()
    );
    assert_running(&mut d);
    wait_drained(&mut redis, &b.key, Duration::from_secs(30)).await;
    assert_family_empty(&mut redis, &b.key).await;
}

/// Atomically: is `member` in pending, in flight, dead?
async fn whereabouts(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    member: &[u8],
) -> (bool, bool, bool) {
    let f = family(key);
    let (p, i, d): (i64, i64, i64) = redis::Script::new(
        "return {redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0, \
                 redis.call('ZSCORE', KEYS[2], ARGV[1]) and 1 or 0, \
                 redis.call('ZSCORE', KEYS[3], ARGV[1]) and 1 or 0}",
    )
    .key(&f.pending)
    .key(&f.inflight)
    .key(&f.dead)
    .arg(member)
    .invoke_async(conn)
    .await
    .unwrap();
    (p == 1, i == 1, d == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_publish_is_dead_lettered_then_requeue_delivers_it() {
    let b = BusinessSpec::with_extra("unroutable", "max_attempts = 3\nretry_backoff = \"100ms\"");
    let Consumers { dir, amqp, ch, .. } = Consumers::exchanges_only(&amqp_url(), &[&b]).await;
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let mut redis = redis().await;
    let body = unique("no-route").into_bytes();
    let now = redis_now_ms(&mut redis).await;
    zadd_many(&mut redis, &b.key, &[(now as f64, body.clone())]).await;
    let mut d = Daemon::start(&config);

    // Until it is dead, the member is always somewhere: never dropped.
    let start = Instant::now();
    loop {
        let (p, i, dead) = whereabouts(&mut redis, &b.key, &body).await;
        assert!(
            p || i || dead,
            "the unroutable member vanished from pending, in-flight and dead; log:\n{}",
            d.tail()
        );
        if dead {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not dead-lettered within 20s; log:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let f = family(&b.key);
    assert_dead_with_reason(&mut redis, &b.key, &body, "unroutable").await;
    // Dead means dead: it stays there and nothing else is left.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        whereabouts(&mut redis, &b.key, &body).await,
        (false, false, true)
    );

    let cfg = config.to_str().unwrap().to_string();
    let (code, out, err) =
        tokio::task::block_in_place(|| delayd(&["dead", "list", "--config", &cfg, "unroutable"]));
    assert_eq!(code, 0, "dead list failed: {err}");
    assert!(
        out.contains(std::str::from_utf8(&body).unwrap()),
        "dead list does not show the member: {out}"
    );
    assert!(
        out.contains("unroutable"),
        "dead list shows no reason: {out}"
    );

    // Now give it somewhere to go and requeue it.
    let inbox = bind_and_consume(&amqp, &ch, &b, &unique("q")).await;
    let (code, out, err) = tokio::task::block_in_place(|| {
        delayd(&["dead", "requeue", "--config", &cfg, "unroutable"])
    });
    assert_eq!(code, 0, "dead requeue failed: {err}");
    assert!(out.contains("requeued 1"), "{out}");
    wait_all(
        &inbox,
        &HashSet::from([body.clone()]),
        Duration::from_secs(15),
        &d,
    )
    .await;
    inbox.settle(Duration::from_millis(1000)).await;
    assert_eq!(inbox.len(), 1, "delivered exactly once after requeue");
    assert_eq!(inbox.all()[0].body, body);
    assert_eq!(zcard(&mut redis, &f.dead).await, 0, "dead set empty");
    wait_drained(&mut redis, &b.key, Duration::from_secs(5)).await;
    assert_family_empty(&mut redis, &b.key).await;
    assert_running(&mut d);
}

/// A queue at its length limit nacks (reject-publish): that is overload,
/// not failure. Nothing may reach the dead set however long it lasts, and
/// everything arrives once the consumer makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_publish_stays_pending_without_counting_attempts_until_the_queue_has_room() {
    let b = BusinessSpec::with_extra("nacked", "max_attempts = 3\nretry_backoff = \"100ms\"");
    let dir = tempfile::tempdir().unwrap();
    let (amqp, ch) = amqp_channel().await;
    let queue = unique("q");
    // Room for one message; the broker nacks publishes beyond that.
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString(LongString::from("reject-publish")),
    );
    declare_with(&ch, &b.exchange, &queue, &b.routing_key, args).await;
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let mut redis = redis().await;
    let items = schedule_due_now(&mut redis, &b.key, "full", 5).await;
    let mut d = Daemon::start(&config);

    // Full for 3 x max_attempts x retry_backoff, and then some.
    let f = family(&b.key);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            zcard(&mut redis, &f.dead).await,
            0,
            "a nacked member was dead-lettered; log:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(queue_depth(&amqp, &queue).await, 1, "the queue stayed full");
    let pending = zcard_all(&mut redis, &[&b.key, &f.inflight]).await;
    assert_eq!(pending, 4, "the refused members wait in Redis");
    assert!(
        d.logs().contains("nacked"),
        "the log says the broker nacked; log:\n{}",
        d.tail()
    );
    // The consumer catches up: everything arrives, exactly once.
    let inbox = Inbox::default();
    consume_into(&amqp, &queue, &inbox, true).await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
    wait_all(&inbox, &want, Duration::from_secs(30), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    assert_eq!(inbox.len(), 5, "each member delivered once");
    assert_eq!(zcard(&mut redis, &f.dead).await, 0);
    wait_drained(&mut redis, &b.key, Duration::from_secs(10)).await;
    assert_running(&mut d);
    drop(d);
    // Let the sweep's state go with the family: retried members' state is
    // deleted at their ack.
    assert_family_empty(&mut redis, &b.key).await;
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

/// A quorum queue as the target, at its length limit (reject-publish): the
/// broker confirms what the queue took and nacks the rest, and delayd takes
/// a member out of Redis only for a confirm, so at every moment what left
/// Redis is in the queue. Once the consumer makes room everything arrives,
/// each member once, and a first delivery carries no `x-delivery-count`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_target_gets_each_member_once_without_a_delivery_count_and_what_it_refuses_stays_pending(
) {
    // Paced, a few at a time: a quorum queue tells the channels publishing
    // to it that it is full only after it is, and takes a burst already on
    // the way.
    let b = BusinessSpec::with_extra(
        "quorum",
        "max_attempts = 3\nretry_backoff = \"100ms\"\nscanners = 1\nbatch_size = 5\nmax_rate = 100",
    );
    let dir = tempfile::tempdir().unwrap();
    let (amqp, ch) = amqp_channel().await;
    let queue = unique("qq");
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(3));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString(LongString::from("reject-publish")),
    );
    declare_with(&ch, &b.exchange, &queue, &b.routing_key, args).await;
    // Full before delayd publishes.
    let fillers = 3;
    ch.confirm_select(Default::default()).await.unwrap();
    for i in 0..fillers {
        let body = format!("filler-{i}");
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                Default::default(),
                body.as_bytes(),
                Default::default(),
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
    }
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let mut redis = redis().await;
    let n = 100;
    let items = schedule_due_now(&mut redis, &b.key, "quorum", n).await;
    let mut d = Daemon::start(&config);

    let f = family(&b.key);
    let start = Instant::now();
    let mut depth = 0;
    while start.elapsed() < Duration::from_secs(3) {
        // Redis first: the queue only grows, so what left Redis before the
        // depth was read must be in it. One transaction: a nacked member
        // moves from in-flight back to pending between two reads.
        let (due, inflight): (u64, u64) = redis::pipe()
            .atomic()
            .zcard(&b.key)
            .zcard(&f.inflight)
            .query_async(&mut redis)
            .await
            .unwrap();
        let pending = due + inflight;
        depth = queue_depth(&amqp, &queue).await as u64 - fillers;
        assert!(
            n as u64 - pending <= depth,
            "{} members left Redis, {depth} are in the queue; log:\n{}",
            n as u64 - pending,
            d.tail()
        );
        assert_eq!(zcard(&mut redis, &f.dead).await, 0, "{}", d.tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        depth < n as u64,
        "the queue took all {n}: it refused nothing"
    );
    let inbox = Inbox::default();
    consume_into(&amqp, &queue, &inbox, true).await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
    wait_all(&inbox, &want, Duration::from_secs(30), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    assert_eq!(
        inbox.len(),
        n + fillers as usize,
        "each member delivered once"
    );
    let counted: Vec<_> = inbox
        .all()
        .into_iter()
        .filter(|r| r.headers.contains_key("x-delivery-count"))
        .collect();
    assert!(
        counted.is_empty(),
        "{} arrived with an x-delivery-count",
        counted.len()
    );
    assert_eq!(zcard(&mut redis, &f.dead).await, 0);
    wait_drained(&mut redis, &b.key, Duration::from_secs(10)).await;
    assert_running(&mut d);
    drop(d);
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_members_are_delivered_or_dead_lettered_and_never_wedge_a_scanner() {
    // A private broker whose message size limit (5 MiB) is cheap to exceed.
    let dir = tempfile::tempdir().unwrap();
    let node =
        PrivateRabbit::started(dir.path(), "[{rabbit, [{max_message_size, 5242880}]}].\n").await;
    let b = BusinessSpec::with_extra("hostile", "max_attempts = 3\nretry_backoff = \"100ms\"");
    let s = Setup::on(&redis_url(), &node.url(), &[&b]).await;
    let (config, inbox, mut redis) = (&s.config, s.inbox().clone(), s.redis.clone());

    let random_bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rand::random::<u8>()).collect() };
    let mut big = b"b-four-mib-".to_vec();
    big.extend(random_bytes(4 * 1024 * 1024));
    // Sorts early among the members due now, so others share its batch
    // (and its channel) when the broker refuses it.
    let mut oversize = b"a-oversize-".to_vec();
    oversize.extend(random_bytes(6 * 1024 * 1024));
    let non_utf8 = vec![0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1];
    let now = redis_now_ms(&mut redis).await as f64;
    let deliverable: Vec<(f64, Vec<u8>)> = vec![
        (now, Vec::new()),
        (now, big.clone()),
        (now, non_utf8.clone()),
        (-5.0, b"negative-score".to_vec()),
    ];
    let never: Vec<(f64, Vec<u8>)> = vec![
        (f64::INFINITY, b"score-plus-inf".to_vec()),
        (1e15, b"far-future-1e15".to_vec()),
    ];
    zadd_many(&mut redis, &b.key, &deliverable).await;
    zadd_many(&mut redis, &b.key, &never).await;
    zadd_many(&mut redis, &b.key, &[(now, oversize.clone())]).await;
    let mut d = Daemon::start(config);

    // Scheduled after the hostile ones, once they have been through a claim.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = redis_now_ms(&mut redis).await as f64;
    zadd_many(
        &mut redis,
        &b.key,
        &[(now + 200.0, b"normal-after".to_vec())],
    )
    .await;

    let mut want: HashSet<Vec<u8>> = deliverable.iter().map(|(_, m)| m.clone()).collect();
    want.insert(b"normal-after".to_vec());
    wait_all(&inbox, &want, Duration::from_secs(30), &d).await;

    let f = family(&b.key);
    let start = Instant::now();
    while !whereabouts(&mut redis, &b.key, &oversize).await.2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the oversize member was not dead-lettered within 30s; log:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let why = "larger than configured max size";
    assert_dead_with_reason(&mut redis, &b.key, &oversize, why).await;
    assert_eq!(
        zcard(&mut redis, &f.dead).await,
        1,
        "only the oversize member is dead"
    );

    inbox.settle(Duration::from_millis(500)).await;
    let got = inbox.all();
    assert_eq!(inbox.bodies(), want, "nothing else delivered");
    for r in &got {
        if r.body == b"negative-score" {
            assert_eq!(r.due(), 0, "a negative score is clamped to epoch 0");
        }
        // Members that shared a channel with the refused one are handed back
        // untouched, not blamed for it: they go out on their first attempt.
        assert!(
            matches!(
                r.headers.get("x-delayd-attempt"),
                Some(AMQPValue::LongLongInt(1))
            ),
            "{:?} was counted as a failed attempt: {:?}; log:\n{}",
            String::from_utf8_lossy(&r.body[..r.body.len().min(16)]),
            r.headers.get("x-delayd-attempt"),
            d.tail()
        );
    }
    // +inf and 1e15 are never due: they stay pending, untouched.
    for (score, m) in &never {
        let s: Option<f64> = zscore(&mut redis, &b.key, m).await;
        assert_eq!(
            s,
            Some(*score),
            "{} must stay pending",
            String::from_utf8_lossy(m)
        );
    }
    assert_eq!(zcard(&mut redis, &f.pending).await, 2);
    assert_eq!(zcard(&mut redis, &f.inflight).await, 0);
    assert_running(&mut d);
    del_family(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_type_key_is_reported_and_other_businesses_go_on() {
    let a = BusinessSpec::random("listkey");
    let b = BusinessSpec::random("fine");
    let s = Setup::new(&[&a, &b]).await;
    let (inbox, mut redis) = (s.inboxes[1].clone(), s.redis.clone());
    let _: i64 = query(&mut redis, "RPUSH", (&a.key, "not-a-zset")).await;
    let mut d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut redis).await;
    let items = flow("fine", 50, 25, now, 200, 1000);
    zadd_many(&mut redis, &b.key, &items).await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
    wait_all(&inbox, &want, Duration::from_secs(20), &d).await;

    let reported = eventually(Duration::from_secs(10), || {
        let logs = d.logs();
        let ok = logs
            .lines()
            .any(|l| l.contains(&a.key) && l.contains("not a sorted set"));
        async move { ok }
    })
    .await;
    assert!(
        reported,
        "no log line names {} and says it is not a sorted set; log:\n{}",
        a.key,
        d.tail()
    );
    assert_running(&mut d);
    del(&mut redis, &a.key).await;
    wait_drained(&mut redis, &b.key, Duration::from_secs(5)).await;
    assert_family_empty(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_while_servers_are_down_and_dispatches_once_they_are_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = PrivateRedis::new(dir.path());
    let mut node = PrivateRabbit::new(dir.path());
    let b = BusinessSpec::random("late_servers");
    let config = write_config(dir.path(), &server.url(), &node.url(), &[&b]);
    let mut d = Daemon::start(&config);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_running(&mut d);

    tokio::task::block_in_place(|| server.start());
    node.start().await;
    let amqp = amqp_at(&node.url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let inbox = bind_and_consume(&amqp, &ch, &b, &unique("q")).await;
    let mut rc = server.conn().await;
    let now = redis_now_ms(&mut rc).await;
    zadd_many(&mut rc, &b.key, &[(now as f64, b"first-light".to_vec())]).await;
    let scheduled = Instant::now();
    wait_all(
        &inbox,
        &HashSet::from([b"first-light".to_vec()]),
        Duration::from_secs(10),
        &d,
    )
    .await;
    eprintln!(
        "delivered {} ms after scheduling",
        scheduled.elapsed().as_millis()
    );
    assert_running(&mut d);
    wait_drained(&mut rc, &b.key, Duration::from_secs(5)).await;
    assert_family_empty(&mut rc, &b.key).await;
}
