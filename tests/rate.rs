//! `max_rate_scope = "cluster"`: one publish budget in Redis, shared by every
//! process and every shard of a business. Real Redis and RabbitMQ; each test
//! its own keys, exchange and queue.

use delayd_test_support as common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use delayd::keys::ShardNames;
use delayd::rate::{rate_key, Limiter, Take};

const RATE: u32 = 200;
const MEMBERS: usize = 4000;
/// What 4,000 members at 200/s take: the first batch goes at once (the
/// budget starts full), the rest at the rate.
const EXPECTED_S: f64 = (MEMBERS - 100) as f64 / RATE as f64;

/// A business of two shards (a budget shared across shards as well as
/// processes), with 4,000 members due now spread over both; returns the
/// shard keys too.
async fn setup(b: &mut BusinessSpec) -> (Setup, Vec<String>) {
    b.extra = format!(
        "shards = 2\nmax_rate = {RATE}\nmax_rate_scope = \"cluster\"\nbatch_size = 100\nlease = \"2s\"\nscanners = 2"
    );
    let mut s = Setup::new(&[b]).await;
    let shards = delayd::keys::shard_keys(&b.key, 2, ShardNames::Index);
    let now = redis_now_ms(&mut s.redis).await as f64;
    for (n, shard) in shards.iter().enumerate() {
        let items: Vec<(f64, Vec<u8>)> = (n..MEMBERS)
            .step_by(2)
            .map(|i| (now, format!("r{i}").into_bytes()))
            .collect();
        zadd_many(&mut s.redis, shard, &items).await;
    }
    (s, shards)
}

/// Seconds from the first message to the one that completed the set of
/// distinct bodies, and how many arrived more than once.
fn drain_seconds(inbox: &Inbox) -> (f64, usize) {
    let mut got = inbox.all();
    got.sort_by_key(|r| r.at_ms);
    let mut seen = HashSet::new();
    let mut last = got[0].at_ms;
    for r in &got {
        if seen.insert(r.body.clone()) {
            last = r.at_ms;
        }
    }
    assert_eq!(seen.len(), MEMBERS, "every member delivered");
    (
        (last - got[0].at_ms) as f64 / 1000.0,
        got.len() - seen.len(),
    )
}

/// Waits for every member, with the daemons' logs on failure.
async fn wait_every_member(inbox: &Inbox, limit: Duration, daemons: &[&Daemon]) {
    let start = Instant::now();
    loop {
        let distinct = inbox.bodies();
        if distinct.len() == MEMBERS {
            return;
        }
        if start.elapsed() > limit {
            let logs: Vec<String> = daemons.iter().map(|d| d.logs()).collect();
            panic!(
                "{} of {MEMBERS} delivered within {limit:?}; logs:\n{}",
                distinct.len(),
                logs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_near_expected(seconds: f64) {
    assert!(
        (EXPECTED_S * 0.9..=EXPECTED_S * 1.1).contains(&seconds),
        "two processes with max_rate = {RATE} shared drained {MEMBERS} in {seconds:.2} s; \
         expected {EXPECTED_S:.1} s ± 10 %"
    );
}

/// The budget key is gone once the budget is full again: nothing is left
/// in Redis by an idle business.
async fn assert_budget_key_expires(redis: &mut redis::aio::MultiplexedConnection, key: &str) {
    let rate = rate_key(key);
    let gone = eventually(Duration::from_secs(3), || {
        let mut r = redis.clone();
        let rate = rate.clone();
        async move {
            let n: i64 = query(&mut r, "EXISTS", &rate).await;
            n == 0
        }
    })
    .await;
    assert!(gone, "{rate} still exists after the drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_cluster_rate_of_200_per_second() {
    let mut b = BusinessSpec::random("rate2");
    let (mut s, shards) = setup(&mut b).await;
    let mut d1 = Daemon::start(&s.config);
    let mut d2 = Daemon::start(&s.config);
    wait_every_member(s.inbox(), Duration::from_secs(40), &[&d1, &d2]).await;
    s.inbox().settle(Duration::from_millis(500)).await;
    let (seconds, duplicates) = drain_seconds(s.inbox());
    eprintln!("drained {MEMBERS} in {seconds:.2} s (expected {EXPECTED_S:.1} s)");
    assert_near_expected(seconds);
    assert_eq!(duplicates, 0, "a clean run delivers each member once");
    for shard in &shards {
        assert_family_empty(&mut s.redis, shard).await;
    }
    assert_budget_key_expires(&mut s.redis, &b.key).await;
    d1.signal(15);
    d2.signal(15);
    assert_eq!(d1.wait(Duration::from_secs(15)).code(), Some(0));
    assert_eq!(d2.wait(Duration::from_secs(15)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_leaves_the_whole_shared_rate_to_the_survivor() {
    let mut b = BusinessSpec::random("ratekill");
    let (mut s, shards) = setup(&mut b).await;
    let mut d1 = Daemon::start(&s.config);
    let d2 = Daemon::start(&s.config);
    // Midway: 1,600 members is 8 s at the shared rate.
    s.inbox().wait_for(1600, Duration::from_secs(20)).await;
    d1.kill();
    wait_every_member(s.inbox(), Duration::from_secs(40), &[&d2]).await;
    s.inbox().settle(Duration::from_millis(500)).await;
    let (seconds, duplicates) = drain_seconds(s.inbox());
    eprintln!(
        "drained {MEMBERS} in {seconds:.2} s with one process killed midway, {duplicates} duplicates"
    );
    assert_near_expected(seconds);
    // A killed process can have published members it never acked: those
    // come again, and no more than it could hold at once.
    assert!(duplicates <= 200, "{duplicates} duplicates");
    for shard in &shards {
        wait_family_empty(&mut s.redis, shard, Duration::from_secs(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_budget_grants_a_burst_then_the_rate_and_takes_back_what_a_claim_left() {
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::with_extra(
        "budget",
        "max_rate = 1000\nmax_rate_scope = \"cluster\"\nbatch_size = 100",
    );
    let path = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let cfg = delayd::config::load(&path).unwrap();
    let conn = delayd::redis_conn::Redis::new(&cfg.redis)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (limiter, burst) = Limiter::for_business(&cfg.businesses[0], &conn).unwrap();
    assert_eq!(burst, 100, "the burst is one batch");
    // Another process's view of the same budget.
    let (other, _) = Limiter::for_business(&cfg.businesses[0], &conn).unwrap();

    // Taken before the request: the budget is emptied on Redis's clock when
    // the script runs, and its reply may reach us milliseconds later, so a
    // clock started on the reply undercounts the refill.
    let emptied = std::time::Instant::now();
    assert_eq!(limiter.take(100, burst).await.unwrap(), Take::Granted(100));
    match other.take(100, burst).await.unwrap() {
        // 1,000/s refills 20 (the fewest worth a claim) in 20 ms.
        Take::Wait(d) => assert!(
            d <= Duration::from_millis(25),
            "an empty budget asks to wait {d:?}"
        ),
        Take::Granted(n) => assert!(n <= 5, "an emptied budget granted {n} at once"),
    }
    limiter.give_back(60, burst).await.unwrap();
    let taken = other.take(100, burst).await.unwrap();
    // The budget also refills 1 a millisecond meanwhile: on a loaded host
    // that is more than the 5 of a quiet one.
    let refilled = emptied.elapsed().as_millis() as usize;
    match taken {
        Take::Granted(n) => assert!(
            (60..=65 + refilled).contains(&n),
            "60 given back, {refilled} ms of refill, yet the other process got {n}"
        ),
        Take::Wait(d) => panic!("60 given back, yet the other process must wait {d:?}"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut redis = redis().await;
    assert_budget_key_expires(&mut redis, &b.key).await;
}
