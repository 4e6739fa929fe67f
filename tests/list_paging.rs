//! Listing pages past a cursor whose member was cancelled costs O(log N),
//! however many members share its due time.

mod common;

use std::time::Duration;

use common::*;
use delayd::tasks::{list, Range};

/// `calls` of one command in `INFO commandstats` (commands run inside
/// scripts count too).
async fn calls(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

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

    // Page through to the middle, then cancel the cursor's member.
    let mut cursor = None;
    for _ in 0..250 {
        let page = list(
            &mut conn,
            &business,
            Range::default(),
            100,
            cursor.as_deref(),
        )
        .await
        .unwrap();
        cursor = page.cursor;
    }
    let shown_last = "m024999";
    let _: i64 = redis::cmd("ZREM")
        .arg(&b.key)
        .arg(shown_last)
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = calls(&mut conn, "zrange").await;
    let started = std::time::Instant::now();
    let page = list(
        &mut conn,
        &business,
        Range::default(),
        100,
        cursor.as_deref(),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    let used = calls(&mut conn, "zrange").await - before;
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
