//! Listing pages past a cursor whose member was cancelled costs O(log N),
//! however many members share its due time.

mod common;

use std::time::Duration;

use common::*;
use delayd::tasks::{list, Range};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_after_a_cancelled_cursor_among_many_equal_scores_is_cheap_and_exact() {
    // A private server: the command counts are this test's alone.
    let dir = tempfile::tempdir().unwrap();
    let mut redis_server = PrivateRedis::new(dir.path());
    redis_server.start();
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
    let _: i64 = redis::cmd("ZREM")
        .arg(&b.key)
        .arg(shown_last)
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = command_stats(&mut conn, "zrange").await.0;
    let started = std::time::Instant::now();
    let page = page(&mut conn, cursor).await;
    let took = started.elapsed();
    let used = command_stats(&mut conn, "zrange").await.0 - before;
    let first: Vec<String> = page
        .tasks
        .iter()
        .take(2)
        .map(|t| String::from_utf8_lossy(&t.member).into_owned())
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
