//! Loss, duplicate and hang paths: each test names one way delayd could lose
//! a claimed member, deliver it twice outside a crash, or hang, and shows it
//! does not. Real Redis and RabbitMQ throughout. The script-level tests call
//! the library's `Store` directly, so they can stage the exact interleaving
//! (a lost reply, a producer's cancel between two claims) that a running
//! daemon only hits by chance.

use delayd_test_support as common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use delayd::config::ScoreUnit;
use delayd::store::{Back, BackPolicy, Claimed, DeadOp, DeadPick, KeyFamily, Store};
use lapin::types::{AMQPValue, FieldTable, LongString};

const LEASE: Duration = Duration::from_secs(30);

async fn store(key: &str) -> Store {
    Store::new(store_conn().await, KeyFamily::new(key), ScoreUnit::Millis)
}

fn policy(reason: &str) -> BackPolicy<'_> {
    BackPolicy {
        reason,
        max_attempts: 5,
        backoff: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
    }
}

/// Claims exactly the given members (all due now) and returns the claim.
async fn claim_now(
    s: &Store,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    members: &[&[u8]],
) -> delayd::store::Claim {
    let now = redis_now_ms(conn).await;
    let items: Vec<(f64, Vec<u8>)> = members
        .iter()
        .map(|m| ((now - 10) as f64, m.to_vec()))
        .collect();
    zadd_many(conn, key, &items).await;
    let c = s.claim(members.len(), LEASE).await.unwrap();
    assert_eq!(c.members.len(), members.len(), "claimed what was due");
    c
}

/// A producer's mistake: K turned into a list.
async fn turn_into_list(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    del(conn, key).await;
    let _: i64 = query(conn, "RPUSH", (key, "oops")).await;
}

/// A script-level test's start: a fresh key, the library's store on it, a
/// connection and the key's family.
async fn store_case(prefix: &str) -> (String, Store, redis::aio::MultiplexedConnection, KeyFamily) {
    let key = unique(prefix);
    (key.clone(), store(&key).await, redis().await, family(&key))
}

fn held(c: &delayd::store::Claim) -> Vec<(u16, Vec<&Claimed>)> {
    vec![(c.tag, c.members.iter().collect())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_type_key_at_release_or_retry_loses_nothing() {
    let (key, s, mut conn, f) = store_case("test:wrongtype").await;
    for mode in [Back::Release, Back::Refused, Back::Nack] {
        let c = claim_now(&s, &mut conn, &key, &[b"m"]).await;
        // A producer turns K into a list while m is in flight.
        turn_into_list(&mut conn, &key).await;
        let err = s.back(mode, &held(&c), &policy("test")).await.unwrap_err();
        assert!(err.is_wrong_type(), "{mode:?}: {err}");
        assert!(
            zscore(&mut conn, &f.inflight, b"m").await.is_some(),
            "{mode:?}: a failed hand-back left the member nowhere"
        );
        // The key is fixed: the same write now goes through.
        del(&mut conn, &key).await;
        let out = s.back(mode, &held(&c), &policy("test")).await.unwrap();
        assert_eq!(out.back, 1, "{mode:?}");
        assert!(
            zscore(&mut conn, &key, b"m").await.is_some(),
            "{mode:?}: back in K"
        );
        assert!(zscore(&mut conn, &f.inflight, b"m").await.is_none());
        del_family(&mut conn, &key).await;
    }
    // A claim on a wrong-type key writes nothing, even with leases to recover.
    let c = claim_now(&s, &mut conn, &key, &[b"r"]).await;
    let _: i64 = query(&mut conn, "ZADD", (&f.inflight, 1, "r")).await;
    turn_into_list(&mut conn, &key).await;
    assert!(s.claim(10, LEASE).await.unwrap_err().is_wrong_type());
    assert!(
        zscore(&mut conn, &f.inflight, b"r").await.is_some(),
        "recovery waited"
    );
    drop(c);
    del_family(&mut conn, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_member_readded_starts_fresh_and_leaves_nothing_behind() {
    let (key, s, mut conn, f) = store_case("test:cancel").await;
    let c = claim_now(&s, &mut conn, &key, &[b"m", b"n"]).await;
    let first_due = c.members[0].due_ms;
    // Both refused once: pending again with a retry state.
    let out = s
        .back(Back::Refused, &held(&c), &policy("unroutable"))
        .await
        .unwrap();
    assert_eq!(out.back, 2);
    // As the settler does once a claim's last member is settled.
    s.forget(&c.record.iter().cloned().collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(hlen(&mut conn, &f.meta).await, 2);
    // The producer cancels both, and re-adds m with a new due time.
    let _: i64 = query(&mut conn, "ZREM", (&key, "m", "n")).await;
    let now = redis_now_ms(&mut conn).await;
    let new_due = now - 5;
    assert_ne!(new_due, first_due);
    zadd_many(&mut conn, &key, &[(new_due as f64, b"m".to_vec())]).await;
    let c2 = s.claim(10, LEASE).await.unwrap();
    assert_eq!(c2.members.len(), 1);
    let m = &c2.members[0];
    assert_eq!(m.attempt, 1, "a re-added member starts at attempt 1");
    assert_eq!(
        m.due_ms, new_due,
        "a re-added member keeps its new due time"
    );
    s.ack(&held(&c2), &c2.record.iter().cloned().collect::<Vec<_>>())
        .await
        .unwrap();
    // n was cancelled for good: one sweep deletes what it left.
    let swept = s.sweep(LEASE).await.unwrap();
    assert_eq!(
        hlen(&mut conn, &f.meta).await,
        0,
        "stale retry state swept ({swept:?})"
    );
    assert_family_empty(&mut conn, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_writes_repeated_after_a_lost_reply_change_nothing() {
    let (key, s, mut conn, f) = store_case("test:repeat").await;
    for mode in [Back::Release, Back::Refused, Back::Nack] {
        let first = claim_now(&s, &mut conn, &key, &[b"m"]).await;
        // The hand-back runs, but its reply is lost...
        s.back(mode, &held(&first), &policy("test")).await.unwrap();
        s.forget(&first.record.iter().cloned().collect::<Vec<_>>())
            .await
            .unwrap();
        // ...m is claimed again (made due now if backoff delayed it)...
        let _: i64 = query(&mut conn, "ZADD", (&key, "XX", 0, "m")).await;
        let second = s.claim(10, LEASE).await.unwrap();
        assert_eq!(second.members.len(), 1);
        let before = zscore(&mut conn, &f.inflight, b"m").await;
        // ...and the retried write arrives: it must not touch the new claim.
        let out = s.back(mode, &held(&first), &policy("test")).await.unwrap();
        assert_eq!((out.back, out.dead, out.skipped), (0, 0, 1), "{mode:?}");
        assert_eq!(
            zscore(&mut conn, &f.inflight, b"m").await,
            before,
            "{mode:?}: lease kept"
        );
        assert!(
            zscore(&mut conn, &key, b"m").await.is_none(),
            "{mode:?}: not put back"
        );
        // A repeated ack of the first claim leaves the second claim's member too.
        let m: Vec<&[u8]> = vec![b"m"];
        let held_m: Vec<&Claimed> = second.members.iter().collect();
        assert_eq!(s.ack(&[(first.tag, held_m.clone())], &[]).await.unwrap(), 0);
        assert!(
            zscore(&mut conn, &f.inflight, b"m").await.is_some(),
            "{mode:?}: ack of an old claim"
        );
        assert_eq!(s.extend(&[(first.tag, m.clone())], LEASE).await.unwrap(), 0);
        assert_eq!(
            s.ack(
                &[(second.tag, held_m)],
                &second.record.iter().cloned().collect::<Vec<_>>()
            )
            .await
            .unwrap(),
            1
        );
        s.sweep(LEASE).await.unwrap();
        assert_family_empty(&mut conn, &key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_and_requeue_never_override_a_producer_schedule() {
    let (key, s, mut conn, f) = store_case("test:override").await;
    let c = claim_now(&s, &mut conn, &key, &[b"m"]).await;
    // The producer reschedules m while it is in flight.
    let later = redis_now_ms(&mut conn).await + 3_600_000;
    zadd_many(&mut conn, &key, &[(later as f64, b"m".to_vec())]).await;
    for mode in [Back::Refused, Back::Nack, Back::Release] {
        let lease_end = (redis_now_ms(&mut conn).await + 30_000) as f64 + c.tag as f64 / 1024.0;
        let _: i64 = query(&mut conn, "ZADD", (&f.inflight, lease_end, "m")).await;
        s.back(mode, &held(&c), &policy("unroutable"))
            .await
            .unwrap();
        assert_eq!(
            zscore(&mut conn, &key, b"m").await,
            Some(later as f64),
            "{mode:?} kept the producer's schedule"
        );
    }
    // A dead member that the producer scheduled again keeps that schedule.
    let _: i64 = query(&mut conn, "ZADD", (&f.dead, 1, "m")).await;
    let requeued = s.dead_act(DeadOp::Requeue, DeadPick::Oldest, 10).await;
    assert_eq!(requeued.unwrap().n, 1);
    assert_eq!(
        zscore(&mut conn, &key, b"m").await,
        Some(later as f64),
        "requeue kept the producer's schedule"
    );
    assert_eq!(zcard(&mut conn, &f.dead).await, 0);
    // And the member later starts afresh: attempt 1 at the producer's due time.
    let _: i64 = query(&mut conn, "ZADD", (&key, "XX", later - 3_600_000 - 1, "m")).await;
    let c2 = s.claim(1, LEASE).await.unwrap();
    assert_eq!(c2.members[0].attempt, 1);
    del_family(&mut conn, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_claim_records_are_swept_without_any_lease_expiring() {
    let (key, s, mut conn, f) = store_case("test:records").await;
    let lease = Duration::from_millis(300);
    let now = redis_now_ms(&mut conn).await;
    zadd_many(
        &mut conn,
        &key,
        &[
            ((now - 1) as f64, b"a".to_vec()),
            ((now - 1) as f64, b"b".to_vec()),
        ],
    )
    .await;
    let c = s.claim(10, lease).await.unwrap();
    assert!(c.record.is_some());
    // Both acked, but the record's deletion was lost (failed HDEL, lost reply).
    assert_eq!(s.ack(&held(&c), &[]).await.unwrap(), 2);
    assert_eq!(hlen(&mut conn, &f.claims).await, 1);
    // Younger than a lease: kept (its claim may still be settling).
    s.sweep(lease).await.unwrap();
    assert_eq!(
        hlen(&mut conn, &f.claims).await,
        1,
        "a young record is kept"
    );
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let out = s.sweep(lease).await.unwrap();
    assert_eq!(out.records, 1);
    assert_family_empty(&mut conn, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_reads_only_the_records_it_needs_and_keeps_due_times() {
    let (key, s, mut conn, f) = store_case("test:recover").await;
    let now = redis_now_ms(&mut conn).await;
    // 200 claims of 50 members with 1 KB bodies each: 10 MB in records.
    let lease = Duration::from_secs(3);
    let mut dues = std::collections::HashMap::new();
    let mut items = Vec::new();
    for c in 0..200 {
        for i in 0..50 {
            let mut body = format!("c{c}-{i}-").into_bytes();
            body.resize(1024, b'x');
            let due = now - 1000 + c;
            dues.insert(body.clone(), due);
            items.push((due as f64, body));
        }
    }
    zadd_many(&mut conn, &key, &items).await;
    for _ in 0..200 {
        let claim = s.claim(50, lease).await.unwrap();
        assert_eq!(claim.members.len(), 50);
        assert_eq!(claim.recovered, 0);
    }
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    // Each recovering claim call is bounded; together they recover all,
    // each at its original due time.
    let mut recovered = 0;
    let mut slowest = Duration::ZERO;
    while recovered < 10_000 {
        let t = Instant::now();
        let c = s.claim(0, LEASE).await.unwrap();
        slowest = slowest.max(t.elapsed());
        assert!(c.recovered > 0, "recovery made no progress");
        recovered += c.recovered;
    }
    assert!(
        slowest < Duration::from_millis(2000),
        "one recovery call took {slowest:?}"
    );
    let items: Vec<(Vec<u8>, f64)> = query(&mut conn, "ZRANGE", (&key, 0, -1, "WITHSCORES")).await;
    assert_eq!(items.len(), 10_000);
    for (m, sc) in items {
        assert_eq!(sc as i64, dues[&m], "recovered at its original due time");
    }
    assert_eq!(zcard(&mut conn, &f.inflight).await, 0);
    let records_left = hlen(&mut conn, &f.claims).await;
    assert_eq!(
        records_left, 0,
        "the recovery deleted the records it emptied"
    );
    del_family(&mut conn, &key).await;
}

/// A claim reply must be read well within the client's response timeout,
/// so a claim takes at most 8 MiB of members (`store::CLAIM_BYTES`), and
/// always at least one member, however large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_bounded_in_bytes_and_takes_at_least_one_member() {
    const BOUND: usize = 8 << 20;
    let key = unique("test:claimbytes");
    let s = store(&key).await;
    let mut conn = redis().await;
    let now = redis_now_ms(&mut conn).await;
    // A 9 MiB member first, then twenty of 1 MiB.
    let mut items = vec![((now - 100) as f64, vec![b'a'; 9 << 20])];
    for i in 0..20u8 {
        let mut m = vec![b'x'; 1 << 20];
        m[0] = i;
        items.push(((now - 50) as f64, m));
    }
    zadd_many(&mut conn, &key, &items).await;
    let first = s.claim(256, LEASE).await.unwrap();
    assert_eq!(first.members.len(), 1, "the large member is claimed alone");
    assert_eq!(first.members[0].member.len(), 9 << 20);
    let mut taken = 1;
    while taken < 21 {
        let c = s.claim(256, LEASE).await.unwrap();
        let bytes: usize = c.members.iter().map(|m| m.member.len()).sum();
        assert!(!c.members.is_empty(), "a claim with members due took none");
        assert!(bytes <= BOUND, "one claim took {bytes} bytes");
        taken += c.members.len();
    }
    assert_eq!(taken, 21);
    del_family(&mut conn, &key).await;

    // In id mode the bodies count: three 5 MiB bodies go one per claim.
    let key = unique("test:claimbytes-id");
    let s = store(&key)
        .await
        .with_member(delayd::config::MemberMode::Id { dedup_window: None });
    let f = family(&key);
    for i in 0..3 {
        let id = format!("id-{i}");
        let _: () = query(&mut conn, "HSET", (&f.body, &id, vec![b'b'; 5 << 20])).await;
        zadd_many(&mut conn, &key, &[((now - 10) as f64, id.into_bytes())]).await;
    }
    for _ in 0..3 {
        let c = s.claim(256, LEASE).await.unwrap();
        assert_eq!(c.members.len(), 1, "one 5 MiB body per 8 MiB claim");
        assert_eq!(c.members[0].body.as_ref().map(Vec::len), Some(5 << 20));
    }
    del_family(&mut conn, &key).await;
}

/// A member whose lease expires on every attempt (a reply too large to
/// read in time, a process that dies on it) must not cycle for ever: once
/// its expired attempts reach `max_attempts` (5 by default) the recovering
/// claim moves it to the dead set with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_keeps_expiring_ends_in_the_dead_set_with_its_reason() {
    let (key, s, mut conn, f) = store_case("test:expiring").await;
    let now = redis_now_ms(&mut conn).await;
    zadd_many(&mut conn, &key, &[((now - 10) as f64, b"poison".to_vec())]).await;
    let lease = Duration::from_millis(40);
    let mut attempts = Vec::new();
    for _ in 0..10 {
        let c = s.claim(10, lease).await.unwrap();
        if let Some(m) = c.members.first() {
            attempts.push(m.attempt);
        }
        // The claimer never settles: its lease runs out.
        tokio::time::sleep(lease + Duration::from_millis(30)).await;
    }
    assert_eq!(
        attempts,
        vec![1, 2, 3, 4, 5],
        "claimed once per allowed attempt"
    );
    assert_eq!(
        zrange::<Vec<u8>>(&mut conn, &f.dead).await,
        vec![b"poison".to_vec()]
    );
    let reason = dead_reason(&mut conn, &key, "poison").await;
    assert_eq!(reason.as_deref(), Some("lease expired after 5 attempts"));
    assert_eq!(zcard(&mut conn, &key).await, 0);
    assert_eq!(zcard(&mut conn, &f.inflight).await, 0);
    assert_eq!(hlen(&mut conn, &f.meta).await, 0);
    del_family(&mut conn, &key).await;
}

/// A flow where routed and unroutable members alternate within every batch:
/// a headers exchange routes only the members whose `x-delayd-due` is bound
/// (`all-with-x`: plain `all` ignores headers that start with `x-`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_are_matched_to_their_own_member() {
    let flow = ReturnsFlow {
        groups: 40,
        per_group: 30,
        extra: "max_attempts = 1\nbatch_size = 64",
        settle_within: Duration::from_secs(30),
    };
    flow.run_and_check("returns").await;
}

/// An exchange with no queue at the broker's pace, both cores kept busy:
/// RabbitMQ returns each message and acks whole runs of them with one
/// `multiple` ack, and lapin pins the waiting returns on that ack's tags
/// in no fixed order, so a member's own ack often resolves before the
/// confirm carrying its return. Every member still ends dead (one attempt),
/// none deleted as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_return_always_wins_over_the_ack_it_rides_with_under_load() {
    let b = BusinessSpec::with_extra(
        "returns_load",
        "max_attempts = 1\nbatch_size = 2000\nwindow = 8000\nscanners = 4",
    );
    let dir = tempfile::tempdir().unwrap();
    let (_amqp, ch) = amqp_channel().await;
    declare_exchange(&ch, &b.exchange).await;
    let mut redis = redis().await;
    let now = redis_now_ms(&mut redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..20_000)
        .map(|i| {
            (
                (now - 60_000 + i / 100) as f64,
                format!("nr-{i:05}").into_bytes(),
            )
        })
        .collect();
    let total = items.len() as u64;
    zadd_many(&mut redis, &b.key, &items).await;
    let busy = CpuHog::start(2, Duration::from_secs(120));
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let d = Daemon::start(&config);
    let f = family(&b.key);
    let settled = eventually_settled(&redis, &b.key, Duration::from_secs(120)).await;
    drop(busy);
    let dead = zcard(&mut redis, &f.dead).await;
    let orphans = d
        .logs()
        .matches("a returned message matches no member")
        .count();
    assert!(settled, "not settled within 120 s; log:\n{}", d.tail());
    assert_eq!(
        dead,
        total,
        "{} unroutable members deleted as delivered ({orphans} returns matched no member)",
        total - dead
    );
    del_family(&mut redis, &b.key).await;
    ch.exchange_delete(b.exchange.as_str().into(), Default::default())
        .await
        .unwrap();
}

/// Spins `threads` threads until dropped (or `limit` passes), so the
/// daemon's I/O and settling threads are descheduled at random points.
struct CpuHog(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl CpuHog {
    fn start(threads: usize, limit: Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for _ in 0..threads {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + limit;
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            });
        }
        Self(stop)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Due times in groups of members, every even group routed (bound by its
/// `x-delayd-due` on a headers exchange) and every odd one unroutable.
struct ReturnsFlow {
    groups: i64,
    per_group: usize,
    extra: &'static str,
    settle_within: Duration,
}

impl ReturnsFlow {
    async fn run_and_check(&self, name: &str) {
        let mut b = BusinessSpec::random(name);
        b.extra = self.extra.into();
        let dir = tempfile::tempdir().unwrap();
        let (amqp, ch) = amqp_channel().await;
        declare_exchange_kind(&ch, &b.exchange, lapin::ExchangeKind::Headers).await;
        let queue = unique("q");
        declare_queue(&ch, &queue).await;
        let mut redis = redis().await;
        let now = redis_now_ms(&mut redis).await;
        let mut routed = HashSet::new();
        let mut unroutable = HashSet::new();
        let mut items = Vec::new();
        for g in 0..self.groups {
            let due = now - 100_000 + g;
            if g % 2 == 0 {
                let mut args = FieldTable::default();
                args.insert(
                    "x-match".into(),
                    AMQPValue::LongString(LongString::from("all-with-x")),
                );
                args.insert("x-delayd-due".into(), AMQPValue::LongLongInt(due));
                ch.queue_bind(
                    queue.as_str().into(),
                    b.exchange.as_str().into(),
                    "".into(),
                    Default::default(),
                    args,
                )
                .await
                .unwrap();
            }
            for i in 0..self.per_group {
                let m = format!("ret-{g}-{i}").into_bytes();
                if g % 2 == 0 {
                    routed.insert(m.clone())
                } else {
                    unroutable.insert(m.clone())
                };
                items.push((due as f64, m));
            }
        }
        let total = items.len() as u64;
        let inbox = consume(&amqp, &queue).await;
        zadd_many(&mut redis, &b.key, &items).await;
        let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
        let d = Daemon::start(&config);
        let f = family(&b.key);
        // Settled once nothing is pending or in flight: a member deleted as
        // delivered is then in neither the dead set nor the inbox.
        let settled = eventually_settled(&redis, &b.key, self.settle_within).await;
        inbox.settle(Duration::from_millis(500)).await;
        let accounted = zcard(&mut redis, &f.dead).await + inbox.len() as u64;
        let got: HashSet<Vec<u8>> = inbox.all().into_iter().map(|r| r.body).collect();
        let dead: HashSet<Vec<u8>> = zrange(&mut redis, &f.dead).await.into_iter().collect();
        let lost: Vec<_> = unroutable.difference(&dead).collect();
        assert!(
            lost.is_empty(),
            "{} of {} unroutable members neither dead nor pending (deleted as delivered); {accounted} of {total} accounted for; log:\n{}",
            lost.len(),
            unroutable.len(),
            d.logs()
        );
        assert!(
            settled,
            "not settled within {:?}; log:\n{}",
            self.settle_within,
            d.logs()
        );
        let wrongly_dead: Vec<_> = routed.intersection(&dead).collect();
        assert!(
            wrongly_dead.is_empty(),
            "{} routed members were taken for returned",
            wrongly_dead.len()
        );
        assert_eq!(got, routed, "every routed member arrived");
        assert_eq!(inbox.len(), routed.len(), "and exactly once");
        del_family(&mut redis, &b.key).await;
        ch.queue_delete(queue.as_str().into(), Default::default())
            .await
            .unwrap();
        ch.exchange_delete(b.exchange.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}

/// Under a memory alarm RabbitMQ blocks publishers: a batch caught mid-publish
/// must keep its lease (no other claim may take and publish it again), and a
/// stop during the alarm must end within shutdown_timeout with the batch back
/// in pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_broker_neither_duplicates_nor_hangs_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let rabbit = PrivateRabbit::started(dir.path(), "").await;
    let b = BusinessSpec::with_extra(
        "blocked",
        "lease = \"2s\"\nshutdown_timeout = \"3s\"\nbatch_size = 20\nscanners = 2",
    );
    let s = Setup::on(&redis_url(), &rabbit.url(), &[&b]).await;
    let (config, inbox, mut redis) = (&s.config, s.inbox().clone(), s.redis.clone());
    let alarm = Alarm(&rabbit);

    // A steady flow over 12 s; the alarm holds for 3 leases in the middle.
    let now = redis_now_ms(&mut redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..1200)
        .map(|i| ((now + 500 + i * 10) as f64, format!("blk-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &items).await;
    let mut d = Daemon::start(config);
    tokio::time::sleep(Duration::from_secs(3)).await;
    alarm.raise().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    alarm.clear().await;
    let want: HashSet<Vec<u8>> = items.iter().map(|(_, m)| m.clone()).collect();
    let ok = inbox.eventually_has(&want, Duration::from_secs(40)).await;
    assert!(ok, "not all delivered after the alarm; log:\n{}", d.logs());
    inbox.settle(Duration::from_secs(1)).await;
    assert_eq!(
        inbox.len(),
        want.len(),
        "members delivered twice without a crash; log:\n{}",
        d.logs()
    );

    // Blocked again, with members coming due: SIGTERM must still stop in time.
    alarm.raise().await;
    let now = redis_now_ms(&mut redis).await;
    let more: Vec<(f64, Vec<u8>)> = (0..200)
        .map(|i| ((now + i * 5) as f64, format!("blk2-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &more).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    d.signal(15);
    let status = d.wait(Duration::from_secs(15));
    assert!(status.success(), "exit status {status}; log:\n{}", d.logs());
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "stop took {:?} with shutdown_timeout = 3s",
        t.elapsed()
    );
    let f = family(&b.key);
    assert_eq!(
        zcard(&mut redis, &f.inflight).await,
        0,
        "unconfirmed members went back to pending"
    );
    alarm.clear().await;
    // Everything is delivered by the next run.
    let d2 = Daemon::start(config);
    let want2: HashSet<Vec<u8>> = more.iter().map(|(_, m)| m.clone()).collect();
    let ok = inbox.eventually_has(&want2, Duration::from_secs(30)).await;
    assert!(
        ok,
        "members lost across a stop under alarm; log:\n{}",
        d2.logs()
    );
    del_family(&mut redis, &b.key).await;
    drop(alarm);
}

async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, buf)
}

fn metric(text: &str, name: &str, business: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("business=\"{business}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A deleted exchange closes the channel with 404 at every publish: delayd
/// must back off and keep the members pending, not claim and hand back at
/// round-trip speed, and resume by itself once the exchange is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_exchange_pauses_publishing_without_spinning() {
    let b = BusinessSpec::random("noexchange");
    let s = Setup::new(&[&b]).await;
    let (config, ch, queue, inbox) = (&s.config, &s.ch, &s.queues[0], s.inbox().clone());
    let port = listen_on_free_port(config, 14000..15000);
    let mut redis = s.redis.clone();
    let d = Daemon::start(config);
    let now = redis_now_ms(&mut redis).await;
    zadd_many(&mut redis, &b.key, &[(now as f64, b"before".to_vec())]).await;
    inbox.wait_for(1, Duration::from_secs(15)).await;

    ch.exchange_delete(b.exchange.as_str().into(), Default::default())
        .await
        .unwrap();
    let now = redis_now_ms(&mut redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..50)
        .map(|i| (now as f64, format!("nx-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &items).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, metrics) = http_get(port, "/metrics").await;
    let released = metric(&metrics, "delayd_released_total", &b.name);
    let claimed = metric(&metrics, "delayd_claimed_total", &b.name);
    assert!(
        claimed < 300.0,
        "claimed {claimed} times in 5 s against a missing exchange (spinning); released {released}"
    );
    assert_eq!(
        metric(&metrics, "delayd_publish_paused", &b.name),
        1.0,
        "paused metric"
    );
    let (code, ready) = http_get(port, "/readyz").await;
    assert_eq!(code, 503, "{ready}");
    assert!(
        ready.contains(&b.name) && ready.contains("paused"),
        "{ready}"
    );
    let f = family(&b.key);
    assert_eq!(zcard(&mut redis, &f.dead).await, 0, "nothing dead");
    assert_eq!(
        zcard_all(&mut redis, &[&b.key, &f.inflight]).await,
        50,
        "every member still pending"
    );
    assert_eq!(
        d.logs().matches("the broker refused the exchange").count(),
        1,
        "reported once; log:\n{}",
        d.logs()
    );

    // The exchange comes back: everything is delivered, once.
    declare(ch, &b.exchange, queue, &b.routing_key).await;
    inbox.wait_for(51, Duration::from_secs(40)).await;
    inbox.settle(Duration::from_millis(500)).await;
    assert_eq!(inbox.len(), 51);
    let (code, ready) = http_get(port, "/readyz").await;
    assert_eq!(code, 200, "{ready}");
    wait_drained(&mut redis, &b.key, Duration::from_secs(5)).await;
    assert_family_empty(&mut redis, &b.key).await;
}

/// Turns K (KEYS[1]) into a list, keeping its members in KEYS[2].
const TO_LIST: &str =
    "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end \
    redis.call('RPUSH', KEYS[1], 'oops')";
/// Turns K back into a sorted set with its members, and whatever delayd
/// could not write meanwhile is still in flight.
const TO_ZSET: &str = "redis.call('DEL', KEYS[1]) \
    if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('RENAME', KEYS[2], KEYS[1]) end";

/// Runs `TO_LIST` or `TO_ZSET` on K and the key its members wait aside in.
async fn on_k(redis: &mut redis::aio::MultiplexedConnection, script: &str, key: &str, aside: &str) {
    let _: () = redis::Script::new(script)
        .key(key)
        .key(aside)
        .invoke_async(redis)
        .await
        .unwrap();
}

/// A minute of everything at once: a steady flow while, at random, the only
/// queue is unbound and rebound, K is turned into a list and back, members
/// are cancelled and re-added, and delayd is SIGKILLed twice. At the end
/// every member was delivered or sits in K or the dead set, and the key
/// family holds nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_of_faults_loses_nothing_and_leaves_nothing_behind() {
    let b = BusinessSpec::with_extra("soak", "lease = \"2s\"\nmax_attempts = 1000\nretry_backoff = \"200ms\"\nretry_backoff_max = \"1s\"");
    let s = Setup::new(&[&b]).await;
    let (config, ch, queue, inbox) = (&s.config, &s.ch, &s.queues[0], s.inbox().clone());
    let mut redis = s.redis.clone();
    let f = family(&b.key);
    let saved = format!("{}:saved", f.meta);

    let secs = 60u64;
    let start = Instant::now();
    let mut d = Daemon::start(config);
    let mut kills: Vec<u64> = vec![rand::random_range(5..25), rand::random_range(30..50)];
    let mut scheduled: HashSet<Vec<u8>> = HashSet::new();
    let mut cancelled: HashSet<Vec<u8>> = HashSet::new();
    let mut n = 0u64;
    let mut unbound = false;
    let mut listed = false;
    while start.elapsed() < Duration::from_secs(secs) {
        let elapsed = start.elapsed().as_secs();
        // ~100 members a second, due within the next two seconds.
        if !listed {
            let now = redis_now_ms(&mut redis).await;
            let items: Vec<(f64, Vec<u8>)> = (0..10)
                .map(|_| {
                    n += 1;
                    (
                        (now + rand::random_range(0..2000)) as f64,
                        format!("soak-{n}").into_bytes(),
                    )
                })
                .collect();
            zadd_many(&mut redis, &b.key, &items).await;
            scheduled.extend(items.into_iter().map(|(_, m)| m));
        }
        match rand::random_range(0..100) {
            0..3 => {
                set_bound(ch, queue, &b, unbound).await;
                unbound = !unbound;
            }
            3..5 => {
                // K becomes a list for a moment; its members wait aside.
                // Atomically: delayd may write K between two commands.
                let script = if listed { TO_ZSET } else { TO_LIST };
                on_k(&mut redis, script, &b.key, &saved).await;
                listed = !listed;
            }
            5..15 if !listed => {
                // Cancel a few pending members; re-add half of them later.
                let some: Vec<Vec<u8>> = redis::cmd("ZRANDMEMBER")
                    .arg(&b.key)
                    .arg(3)
                    .query_async(&mut redis)
                    .await
                    .unwrap_or_default();
                for m in some {
                    let removed: i64 = query(&mut redis, "ZREM", (&b.key, &m)).await;
                    if removed == 1 {
                        if rand::random::<bool>() {
                            let now = redis_now_ms(&mut redis).await;
                            zadd_many(&mut redis, &b.key, &[((now + 500) as f64, m.clone())]).await;
                        } else {
                            cancelled.insert(m);
                        }
                    }
                }
            }
            _ => {}
        }
        if kills.first().is_some_and(|k| elapsed >= *k) {
            kills.remove(0);
            d.kill();
            d = Daemon::start(config);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Calm: the queue bound, K a sorted set again, and time to settle.
    if listed {
        on_k(&mut redis, TO_ZSET, &b.key, &saved).await;
    }
    if unbound {
        set_bound(ch, queue, &b, true).await;
    }
    let want: HashSet<Vec<u8>> = scheduled.difference(&cancelled).cloned().collect();
    let ok = inbox.eventually_has(&want, Duration::from_secs(60)).await;
    let got = inbox.bodies();
    let dead: Vec<Vec<u8>> = zrange(&mut redis, &f.dead).await;
    let pending: Vec<Vec<u8>> = zrange(&mut redis, &b.key).await;
    let lost: Vec<_> = want
        .iter()
        .filter(|m| !got.contains(*m) && !dead.contains(*m) && !pending.contains(*m))
        .collect();
    assert!(
        ok && lost.is_empty(),
        "{} of {} members lost; log:\n{}",
        lost.len(),
        want.len(),
        d.logs()
    );
    // Nothing else stays: the sweep takes what the kills and cancels left.
    let clean = eventually(Duration::from_secs(20), || {
        let mut r = redis.clone();
        let key = b.key.clone();
        async move { family_keys_left(&mut r, &key).await == 0 }
    })
    .await;
    let meta = hlen(&mut redis, &f.meta).await;
    let claims = hlen(&mut redis, &f.claims).await;
    assert!(
        clean,
        "key family not empty after the soak: {meta} meta, {claims} records; log:\n{}",
        d.logs()
    );
    del(&mut redis, &saved).await;
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweep_reads_a_bounded_slice_of_a_large_retry_state_and_a_pass_removes_it_all() {
    let (_key, s, mut conn, f) = store_case("test:metasweep").await;
    // 100,000 stale entries, as a nack storm followed by cancels leaves.
    for chunk in (0..100_000).collect::<Vec<u32>>().chunks(5000) {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&f.meta);
        for i in chunk {
            cmd.arg(format!("gone-{i}"))
                .arg("1:1767323045000:1767323046000");
        }
        let _: i64 = cmd.query_async(&mut conn).await.unwrap();
    }
    let (mut cursor, out, left) = s.sweep_slice("0", 2000, LEASE).await.unwrap();
    assert_ne!(cursor, "0", "one sweep must not read the whole hash");
    assert!(
        out.meta <= 2600,
        "one sweep deleted {} entries: it read more than its slice",
        out.meta
    );
    assert!(left >= 97_000, "{left} left after one slice");
    let mut calls = 1;
    while cursor != "0" {
        let (next, _, _) = s.sweep_slice(&cursor, 2000, LEASE).await.unwrap();
        cursor = next;
        calls += 1;
        assert!(calls < 200, "the pass never ended");
    }
    assert_eq!(
        hlen(&mut conn, &f.meta).await,
        0,
        "a whole pass removes every stale entry"
    );
}
