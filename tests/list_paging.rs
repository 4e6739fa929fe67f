//! Listing pages past a cursor whose member was cancelled costs O(log N),
//! however many members share its due time.

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use delayd::tasks::{list, Range};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_after_a_cancelled_cursor_among_many_equal_scores_is_cheap_and_exact() {
    // A private server: the command counts are this test's alone.
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let b = BusinessSpec::random("paging");
    let config = write_config(dir.path(), &redis_server.url(), &amqp_url(), &[&b]);
    let business = delayd::config::load(&config).unwrap().businesses[0].clone();
    let mut conn = redis_at(&redis_server.url()).await;
    let due = 1_900_000_000_000f64;
    let n = 50_000usize;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| (due, format!("m{i:06}").into_bytes()))
        .collect();
    zadd_many(&mut conn, &b.key, &items).await;

    let page = |conn: &mut redis::aio::MultiplexedConnection, cursor: Option<String>| {
        let (business, mut conn) = (business.clone(), conn.clone());
        async move {
            list(
                &mut conn,
                &business,
                Range::default(),
                100,
                cursor.as_deref(),
                None,
            )
            .await
            .unwrap()
        }
    };
    // Page through to the middle, then cancel the cursor's member.
    let mut cursor = None;
    for _ in 0..250 {
        cursor = page(&mut conn, cursor).await.cursor;
    }
    let shown_last = "m024999";
    let _: i64 = query(&mut conn, "ZREM", (&b.key, shown_last)).await;
    let before = command_stats(&mut conn, "zrange").await.0;
    let started = std::time::Instant::now();
    let page = page(&mut conn, cursor).await;
    let took = started.elapsed();
    let used = command_stats(&mut conn, "zrange").await.0 - before;
    let first: Vec<String> = page
        .tasks
        .iter()
        .take(2)
        .map(|t| String::from_utf8_lossy(&t.member.head).into_owned())
        .collect();
    assert_eq!(
        first,
        ["m025000", "m025001"],
        "the page continues right after the cursor"
    );
    assert_eq!(page.tasks.len(), 100);
    // A binary search: about log2(50,000) ≈ 16 look-ups, and one range.
    assert!(used <= 40, "{used} ZRANGE calls for one page");
    assert!(took < Duration::from_secs(1), "one page took {took:?}");
}

/// Bytes Redis has sent to clients so far.
async fn sent_bytes(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = query(conn, "INFO", "stats").await;
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_net_output_bytes in INFO stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_over_many_shards_reads_about_what_it_shows_not_shards_times_limit() {
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let b = BusinessSpec::with_extra("wide", "shards = 16");
    let config = write_config(dir.path(), &redis_server.url(), &amqp_url(), &[&b]);
    let business = delayd::config::load(&config).unwrap().businesses[0].clone();
    let mut conn = redis_at(&redis_server.url()).await;
    const SHARDS: usize = 16;
    const BODY: usize = 16 * 1024;
    // Sixteen 16 KiB bodies per shard, due times interleaved over shards:
    // a page of 16 shows one or two of each shard's.
    for (i, key) in business.keys().iter().enumerate() {
        let items: Vec<(f64, Vec<u8>)> = (0..SHARDS)
            .map(|j| {
                let mut body = format!("s{i:02}-{j:02}-").into_bytes();
                body.resize(BODY, b'.');
                ((1_900_000_000_000 + j * SHARDS + i) as f64, body)
            })
            .collect();
        zadd_many(&mut conn, key, &items).await;
        let fam = delayd::keys::KeyFamily::new(key);
        for (due, body) in &items {
            let _: () = redis::pipe()
                .zadd(&fam.dead, body.as_slice(), *due)
                .hset(&fam.reasons, body.as_slice(), "r")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    let limit = 16;
    let before = sent_bytes(&mut conn).await;
    let page = list(
        &mut conn.clone(),
        &business,
        Range::default(),
        limit,
        None,
        None,
    )
    .await
    .unwrap();
    let sent = sent_bytes(&mut conn).await - before;
    let want: Vec<String> = (0..limit).map(|i| format!("s{i:02}-00-")).collect();
    let got: Vec<String> = page
        .tasks
        .iter()
        .map(|t| String::from_utf8_lossy(&t.member.head[..7]).into_owned())
        .collect();
    assert_eq!(got, want, "the first page in due order");
    // What the page shows, one head per shard and as much again at most;
    // all of every shard's first page would be 16 x 16 bodies.
    let bound = ((2 * limit + SHARDS) * BODY + 64 * 1024) as u64;
    assert!(
        sent <= bound,
        "a page of {limit} read {sent} bytes (bound {bound})"
    );

    let manager = store_conn_at(&redis_server.url()).await;
    let stores: Vec<delayd::store::Store> = business
        .keys()
        .iter()
        .map(|k| {
            delayd::store::Store::new(
                manager.clone(),
                delayd::keys::KeyFamily::new(k),
                business.score_unit,
            )
        })
        .collect();
    let before = sent_bytes(&mut conn).await;
    let (_, dead) = delayd::tasks::dead::list(&stores, limit).await.unwrap();
    let sent = sent_bytes(&mut conn).await - before;
    assert_eq!(dead.len(), limit);
    assert!(
        dead.windows(2).all(|w| w[0].died_ms <= w[1].died_ms),
        "oldest first"
    );
    assert!(
        sent <= bound,
        "a dead page of {limit} read {sent} bytes (bound {bound})"
    );
}
