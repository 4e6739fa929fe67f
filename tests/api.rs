//! The JSON API under `/api/v1`, against a running delayd and real Redis
//! and RabbitMQ: every endpoint, the token, and bad input (always a 4xx
//! with one line of JSON, never a 500).

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use serde_json::json;

const TOKEN: &str = "test-admin-token-0123456789";

fn id_business(name: &str) -> BusinessSpec {
    let mut b = BusinessSpec::random(name);
    b.extra = "member = \"id\"".into();
    b
}

fn labels_count(h: &serde_json::Value, label: &str) -> u64 {
    h["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["label"] == label)
        .unwrap_or_else(|| panic!("no bucket {label}"))["count"]
        .as_u64()
        .unwrap()
}

/// `GET path`, asserted to answer 200.
async fn api_ok(port: u16, path: &str) -> Answer {
    let page = api_get(port, path).await;
    assert_eq!(page.status, 200, "{}", page.text);
    page
}

/// The console of one business `name`, with no token.
async fn console_of(name: &str) -> (BusinessSpec, ConsoleDaemon) {
    let b = BusinessSpec::random(name);
    let c = ConsoleDaemon::start(&[&b], None).await;
    (b, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_shows_counts_rates_lateness_and_paused_businesses() {
    let live = id_business("live");
    let gone = BusinessSpec::random("gone");
    let c = ConsoleDaemon::start(&[&live, &gone], None).await;
    // The second business's exchange disappears: its publishing pauses.
    c.setup
        .ch
        .exchange_delete(gone.exchange.as_str().into(), Default::default())
        .await
        .unwrap();
    let mut r = c.setup.redis.clone();
    let now = redis_now_ms(&mut r).await;
    for i in 0..3 {
        let _: () = redis::pipe()
            .atomic()
            .hset(family(&live.key).body, format!("later-{i}"), "b")
            .zadd(&live.key, format!("later-{i}"), now + 3_600_000)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    seed_dead(&mut r, &live.key, &[("d1", "no body"), ("d2", "no body")]).await;
    for i in 0..5 {
        let _: () = redis::pipe()
            .atomic()
            .hset(family(&live.key).body, format!("now-{i}"), "b")
            .zadd(&live.key, format!("now-{i}"), now)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    c.setup.inbox().wait_for(5, Duration::from_secs(10)).await;
    let _: () = query(&mut r, "ZADD", (&gone.key, now, "stuck")).await;

    // Rates cover at least a second of samples.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = std::time::Instant::now();
    let mut row = c.overview_of("gone").await;
    while !row["paused"].is_string() && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        row = c.overview_of("gone").await;
    }
    let paused = row["paused"].is_string();
    assert!(paused, "no paused reason: {row}; log:\n{}", c.daemon.tail());
    assert!(
        row["paused"].as_str().unwrap().contains(&gone.exchange),
        "{row}"
    );
    assert_eq!(row["pending"], 1, "{row}");
    assert_eq!(row["due_now"], 1, "{row}");
    assert!(row["oldest_overdue_ms"].as_i64().is_some(), "{row}");

    let all = api_get(c.port, "/api/v1/businesses").await;
    assert_eq!(all.json["read_only"], true);
    assert_eq!(all.json["redis"], "up");
    let row = c.overview_of("live").await;
    assert_eq!(row["member"], "id");
    assert_eq!(row["pending"], 3, "{row}");
    assert_eq!(row["due_now"], 0, "{row}");
    assert_eq!(row["dead"], 2, "{row}");
    assert_eq!(row["in_flight"], 0, "{row}");
    assert_eq!(row["due_within"]["1d"], 3, "{row}");
    assert_eq!(row["due_within"]["1m"], 0, "{row}");
    assert!(row["paused"].is_null(), "{row}");
    let rates = &row["rates"];
    assert!(rates["window_s"].as_f64().unwrap() >= 1.0, "{rates}");
    assert!(rates["confirmed_per_s"].as_f64().unwrap() > 0.0, "{rates}");
    assert!(rates["claimed_per_s"].as_f64().unwrap() > 0.0, "{rates}");
    assert_eq!(rates["dead_lettered_per_s"], 0.0, "{rates}");
    let p50 = rates["lateness_p50_ms"].as_f64().expect("a p50");
    let p99 = rates["lateness_p99_ms"].as_f64().expect("a p99");
    assert!(p50 > 0.0 && p50 <= p99, "{rates}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histogram_counts_each_window_over_every_shard() {
    let b = BusinessSpec::with_extra("hist", "shards = 2");
    let c = ConsoleDaemon::start(&[&b], None).await;
    let mut r = c.setup.redis.clone();
    let now = redis_now_ms(&mut r).await;
    let min = 60_000i64;
    let hour = 60 * min;
    let day = 24 * hour;
    // (offset from now, the bucket it falls in); the daemon would deliver
    // overdue ones, so none is written.
    let plan = [
        (30_000, "+1m"),
        (90_000, "+2m"),
        (59 * min + 1000, "+60m"),
        (90 * min, "+2h"),
        (23 * hour + min, "+24h"),
        (day + hour, "+2d"),
        (6 * day + hour, "+7d"),
        (30 * day, "later"),
    ];
    for (i, (off, _)) in plan.iter().enumerate() {
        // Both shards: the histogram sums them.
        for shard in 0..2 {
            let _: () = query(
                &mut r,
                "ZADD",
                (format!("{}:{shard}", b.key), now + off, format!("task-{i}")),
            )
            .await;
        }
    }
    let h = api_get(c.port, &format!("/api/v1/businesses/{}/histogram", b.name)).await;
    assert_eq!(h.status, 200, "{}", h.text);
    let buckets = h.json["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 91);
    assert_eq!(
        buckets
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum::<u64>(),
        16
    );
    for (_, label) in plan {
        assert_eq!(
            labels_count(&h.json, label),
            2,
            "bucket {label}: {}",
            h.text
        );
    }
    assert_eq!(labels_count(&h.json, "overdue"), 0);
    assert!(buckets[0]["from_ms"].is_null() && buckets[90]["to_ms"].is_null());
    let unknown = api_get(c.port, "/api/v1/businesses/nope/histogram").await;
    unknown.assert_error(404, "unknown business \"nope\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_tasks_page_by_cursor_within_a_due_window() {
    let (b, c) = console_of("pages").await;
    let mut r = c.setup.redis.clone();
    let base = redis_now_ms(&mut r).await + 3_600_000;
    let items: Vec<(f64, Vec<u8>)> = (0..25)
        .map(|i| {
            (
                (base + i * 1000) as f64,
                format!("body-{i:02}").into_bytes(),
            )
        })
        .collect();
    zadd_many(&mut r, &b.key, &items).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(cur) => format!("/api/v1/businesses/{}/tasks?limit=10&cursor={cur}", b.name),
            None => format!("/api/v1/businesses/{}/tasks?limit=10", b.name),
        };
        let page = api_ok(c.port, &path).await;
        for t in page.json["tasks"].as_array().unwrap() {
            seen.push(t["member"]["text"].as_str().unwrap().to_string());
        }
        cursor = page.json["cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("body-{i:02}")).collect();
    assert_eq!(seen, want, "every task once, in due order");

    let window = api_get(
        c.port,
        &format!(
            "/api/v1/businesses/{}/tasks?from={}&to={}",
            b.name,
            base + 5000,
            base + 7000
        ),
    )
    .await;
    let got: Vec<&str> = window.json["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["member"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["body-05", "body-06", "body-07"]);

    for (path, says) in [
        ("tasks?cursor=not-a-cursor", "\"cursor\""),
        ("tasks?from=yesterday", "\"from\" \"yesterday\""),
        ("tasks?limit=0", "\"limit\""),
        ("tasks?limit=abc", "limit"),
        ("tasks?colour=red", "colour"),
    ] {
        let a = api_get(c.port, &format!("/api/v1/businesses/{}/{path}", b.name)).await;
        assert_eq!(a.status, 400, "{path}: {}", a.text);
        assert!(a.error_line().contains(says), "{path}: {}", a.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_found_by_id_with_its_body_cut_to_size() {
    let b = id_business("lookup");
    let body_mode = BusinessSpec::random("bodies");
    let c = ConsoleDaemon::start(&[&b, &body_mode], None).await;
    let mut r = c.setup.redis.clone();
    let due = redis_now_ms(&mut r).await + 3_600_000;
    let huge = "x".repeat(100_000);
    for (id, body) in [("small", "<b>hi</b>"), ("huge", huge.as_str())] {
        let _: () = redis::pipe()
            .atomic()
            .hset(family(&b.key).body, id, body)
            .zadd(&b.key, id, due)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let small = api_get(
        c.port,
        &format!("/api/v1/businesses/{}/tasks/small", b.name),
    )
    .await;
    assert_eq!(small.status, 200, "{}", small.text);
    assert_eq!(small.json["state"], "pending");
    assert_eq!(small.json["due_ms"], due);
    assert_eq!(small.json["key"], b.key.as_str());
    assert_eq!(small.json["body"]["text"], "<b>hi</b>");
    let big = api_get(c.port, &format!("/api/v1/businesses/{}/tasks/huge", b.name)).await;
    assert_eq!(big.json["body"]["bytes"], 100_000);
    assert_eq!(big.json["body"]["truncated"], true);
    assert_eq!(big.json["body"]["text"].as_str().unwrap().len(), 4096);

    let none = api_get(c.port, &format!("/api/v1/businesses/{}/tasks/nope", b.name)).await;
    assert_eq!(none.status, 404);
    assert_eq!(none.json["state"], "not_found");
    assert!(none.error_line().contains("id \"nope\""));
    let wrong = api_get(
        c.port,
        &format!("/api/v1/businesses/{}/tasks/x", body_mode.name),
    )
    .await;
    wrong.assert_error(400, "member = \"body\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_bodies_by_prefix_over_shards_and_says_when_it_is_partial() {
    let b = BusinessSpec::with_extra("search", "shards = 2");
    let c = ConsoleDaemon::start(&[&b], None).await;
    let mut r = c.setup.redis.clone();
    let due = (redis_now_ms(&mut r).await + 3_600_000) as f64;
    for shard in 0..2 {
        let mut items: Vec<(f64, Vec<u8>)> = (0..15_000)
            .map(|i| (due, format!("other-{shard}-{i}").into_bytes()))
            .collect();
        items.extend((0..10).map(|i| (due, format!("order:{shard}:{i}").into_bytes())));
        // A glob character in the prefix matches itself only.
        items.push((due, format!("a*{shard}").into_bytes()));
        zadd_many(&mut r, &format!("{}:{shard}", b.key), &items).await;
    }
    let mut found = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    let mut partial_seen = false;
    loop {
        pages += 1;
        assert!(pages < 50, "the search does not end");
        let path = match &cursor {
            Some(cur) => format!(
                "/api/v1/businesses/{}/search?prefix=order:&cursor={cur}",
                b.name
            ),
            None => format!("/api/v1/businesses/{}/search?prefix=order:", b.name),
        };
        let page = api_ok(c.port, &path).await;
        for t in page.json["tasks"].as_array().unwrap() {
            found.insert(t["member"]["text"].as_str().unwrap().to_string());
        }
        cursor = page.json["cursor"].as_str().map(str::to_string);
        assert_eq!(page.json["partial"], cursor.is_some());
        partial_seen |= cursor.is_some();
        if cursor.is_none() {
            break;
        }
    }
    assert!(
        partial_seen,
        "30,000 members take more than one bounded page"
    );
    assert_eq!(found.len(), 20, "{found:?}");
    assert!(found.iter().all(|f| f.starts_with("order:")));

    let glob = api_get(
        c.port,
        &format!(
            "/api/v1/businesses/{}/search?prefix=a%2A&limit=1000",
            b.name
        ),
    )
    .await;
    let mut got = std::collections::BTreeSet::new();
    let mut page = glob;
    loop {
        for t in page.json["tasks"].as_array().unwrap() {
            got.insert(t["member"]["text"].as_str().unwrap().to_string());
        }
        let Some(cur) = page.json["cursor"].as_str() else {
            break;
        };
        page = api_get(
            c.port,
            &format!(
                "/api/v1/businesses/{}/search?prefix=a%2A&limit=1000&cursor={cur}",
                b.name
            ),
        )
        .await;
    }
    assert_eq!(got, ["a*0".to_string(), "a*1".to_string()].into());
    for bad in ["cursor=9:0", "cursor=x", ""] {
        let a = api_get(
            c.port,
            &format!("/api/v1/businesses/{}/search?{bad}", b.name),
        )
        .await;
        assert_eq!(a.status, 400, "{bad}: {}", a.text);
        a.error_line();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_reschedule_run_now_and_cancel_need_the_token() {
    let b = id_business("acts");
    let body_mode = BusinessSpec::random("acts_body");
    let c = ConsoleDaemon::start(&[&b, &body_mode], Some(TOKEN)).await;
    let tasks = format!("/api/v1/businesses/{}/tasks", b.name);
    let new = json!({ "id": "t1", "body": "payload-1", "in": "1h" });

    let none = api_post(c.port, &tasks, None, &new).await;
    none.assert_error(401, "Authorization: Bearer");
    let wrong = api_post(c.port, &tasks, Some("not-the-token"), &new).await;
    assert_eq!(wrong.status, 401);
    assert!(!wrong.text.contains(TOKEN));

    let made = api_post(c.port, &tasks, c.token(), &new).await;
    assert_eq!(made.status, 201, "{}", made.text);
    let mut r = c.setup.redis.clone();
    let now = redis_now_ms(&mut r).await;
    let due = made.json["due_ms"].as_i64().unwrap();
    assert!(
        (due - now - 3_600_000).abs() < 5_000,
        "due {due}, now {now}"
    );
    let got = api_get(c.port, &format!("{tasks}/t1")).await;
    assert_eq!(got.json["body"]["text"], "payload-1");

    let moved = c
        .post(&format!("{tasks}/t1/reschedule"), json!({ "in": "2h" }))
        .await;
    assert_eq!(moved.status, 200, "{}", moved.text);
    let due2 = moved.json["due_ms"].as_i64().unwrap();
    assert!(due2 - due > 3_500_000, "{due} -> {due2}");
    let moved_unauth = c
        .post_untokened(&format!("{tasks}/t1/reschedule"), json!({ "in": "2h" }))
        .await;
    assert_eq!(moved_unauth.status, 401);

    let run = c.post(&format!("{tasks}/t1/run"), json!({})).await;
    assert_eq!(run.status, 200, "{}", run.text);
    c.setup.inbox().wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(c.setup.inbox().all()[0].body, b"payload-1");

    let t2 = c
        .post(
            &tasks,
            json!({ "id": "t2", "body": "x", "at_ms": now + 7_200_000 }),
        )
        .await;
    assert_eq!(t2.status, 201);
    let cancel_unauth = call(c.port, "DELETE", &format!("{tasks}/t2"), None, None).await;
    assert_eq!(cancel_unauth.status, 401);
    let cancel = call(c.port, "DELETE", &format!("{tasks}/t2"), c.token(), None).await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    assert_eq!(cancel.json["result"], "cancelled");
    let again = call(c.port, "DELETE", &format!("{tasks}/t2"), c.token(), None).await;
    assert_eq!(again.status, 404);
    assert_eq!(again.json["result"], "not_found");
    let gone = c.post(&format!("{tasks}/t2/run"), json!({})).await;
    assert_eq!(gone.status, 404);
    assert_eq!(gone.json["result"], "not_found");

    // Body mode: scheduled by body, no id.
    let body_tasks = format!("/api/v1/businesses/{}/tasks", body_mode.name);
    let ok = c
        .post(
            &body_tasks,
            json!({ "body": "hello", "at": "2100-01-01T00:00:00Z" }),
        )
        .await;
    assert_eq!(ok.status, 201, "{}", ok.text);
    assert_eq!(ok.json["due_ms"], 4_102_444_800_000i64);
    for (path, body, says) in [
        (
            &body_tasks,
            json!({ "id": "x", "body": "b", "in": "1s" }),
            "member = \"body\"",
        ),
        (&tasks, json!({ "body": "b", "in": "1s" }), "\"id\""),
        (
            &tasks,
            json!({ "id": "t", "body": "b", "in": "5 parsecs" }),
            "\"in\" \"5 parsecs\"",
        ),
        (&tasks, json!({ "id": "t", "body": "b" }), "exactly one of"),
        (
            &tasks,
            json!({ "id": "t", "body": "b", "in": "1s", "at_ms": 5 }),
            "exactly one of",
        ),
        (
            &tasks,
            json!({ "id": "t", "body": "b", "at": "soon" }),
            "\"at\" \"soon\"",
        ),
        (&tasks, json!({ "id": "t", "body": 5, "in": "1s" }), "body"),
    ] {
        let a = api_post(c.port, path, c.token(), &body).await;
        assert!(
            a.status == 400 || a.status == 422,
            "{body}: {} {}",
            a.status,
            a.text
        );
        assert!(a.error_line().contains(says), "{body}: {}", a.text);
    }
    let huge = json!({ "id": "big", "body": "x".repeat(2 << 20), "in": "1h" });
    let a = api_post(c.port, &tasks, c.token(), &huge).await;
    a.assert_error(413, "larger than 1048576 bytes");
    assert!(!c.daemon.logs().contains(TOKEN), "the token was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_api_is_read_only() {
    let b = id_business("readonly");
    let c = ConsoleDaemon::start(&[&b], None).await;
    let mut r = c.setup.redis.clone();
    seed_dead(&mut r, &b.key, &[("d1", "no body")]).await;
    let tasks = format!("/api/v1/businesses/{}/tasks", b.name);
    for (method, path, body) in [
        (
            "POST",
            tasks.clone(),
            json!({ "id": "t", "body": "b", "in": "1h" }),
        ),
        ("POST", format!("{tasks}/t/run"), json!({})),
        (
            "POST",
            format!("{tasks}/t/reschedule"),
            json!({ "in": "1h" }),
        ),
        ("DELETE", format!("{tasks}/t"), json!(null)),
        (
            "POST",
            format!("/api/v1/businesses/{}/dead/requeue", b.name),
            json!({ "all": true }),
        ),
        (
            "POST",
            format!("/api/v1/businesses/{}/dead/purge", b.name),
            json!({ "all": true }),
        ),
    ] {
        let body = (!body.is_null()).then(|| body.to_string());
        let a = call(c.port, method, &path, Some("anything"), body.as_deref()).await;
        assert_eq!(a.status, 403, "{method} {path}: {}", a.text);
        assert!(a.error_line().contains("admin_token"), "{}", a.text);
    }
    // Counting changes nothing, so it needs no token.
    let count = c
        .post_untokened(
            &format!("/api/v1/businesses/{}/dead/purge", b.name),
            json!({ "all": true, "dry_run": true }),
        )
        .await;
    assert_eq!(count.status, 200, "{}", count.text);
    assert_eq!(count.json["count"], 1);
    assert_eq!(zcard(&mut r, &family(&b.key).dead).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_members_are_counted_first_then_requeued_or_purged_by_member_reason_or_all() {
    let b = BusinessSpec::with_extra("dead", "shards = 2");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let unroutable = "returned as unroutable (312 NO_ROUTE) after 5 attempts";
    seed_dead(
        &mut r,
        &format!("{}:0", b.key),
        &[
            ("a", unroutable),
            ("b", unroutable),
            ("<script>x</script>", "rejected"),
        ],
    )
    .await;
    seed_dead(
        &mut r,
        &format!("{}:1", b.key),
        &[("c", unroutable), ("d", "rejected"), ("e", "rejected")],
    )
    .await;
    let dead = format!("/api/v1/businesses/{}/dead", b.name);

    let list = api_get(c.port, &dead).await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json["total"], 6);
    let members = list.json["members"].as_array().unwrap();
    assert_eq!(members.len(), 6);
    assert!(members
        .iter()
        .any(|m| m["member"]["text"] == "<script>x</script>" && m["reason"] == "rejected"));
    let limited = api_get(c.port, &format!("{dead}?limit=2")).await;
    assert_eq!(limited.json["members"].as_array().unwrap().len(), 2);

    let requeue = format!("{dead}/requeue");
    let purge = format!("{dead}/purge");
    let count = c
        .post_untokened(&requeue, json!({ "reason": "unroutable", "dry_run": true }))
        .await;
    count.assert_ok_with("count", 3);
    assert_eq!(count.json["dry_run"], true);
    let one = c.post(&requeue, json!({ "member": "c" })).await;
    assert_eq!(one.json["count"], 1, "{}", one.text);
    // Back in K, due now: the running daemon may already have delivered it.
    let back = eventually(Duration::from_secs(10), || {
        let (mut r, key) = (r.clone(), format!("{}:1", b.key));
        let inbox = c.setup.inbox().clone();
        async move { zcard(&mut r, &key).await == 1 || inbox.bodies().contains(b"c".as_slice()) }
    })
    .await;
    assert!(back, "c is neither pending again nor delivered");
    let refused = c
        .post_untokened(&purge, json!({ "reason": "unroutable" }))
        .await;
    assert_eq!(refused.status, 401);
    let by_reason = c.post(&purge, json!({ "reason": "unroutable" })).await;
    assert_eq!(by_reason.json["count"], 2, "{}", by_reason.text);
    let rest = c
        .post_untokened(&requeue, json!({ "all": true, "dry_run": true }))
        .await;
    assert_eq!(rest.json["count"], 3);
    let all = c.post(&requeue, json!({ "all": true })).await;
    assert_eq!(all.json["count"], 3, "{}", all.text);
    let empty = api_get(c.port, &dead).await;
    assert_eq!(empty.json["total"], 0);

    for body in [
        json!({}),
        json!({ "all": true, "member": "a" }),
        json!({ "reason": "" }),
        json!({ "all": true, "limit": 0 }),
        json!({ "all": "yes" }),
    ] {
        let a = api_post(c.port, &requeue, c.token(), &body).await;
        assert!(
            a.status == 400 || a.status == 422,
            "{body}: {} {}",
            a.status,
            a.text
        );
        a.error_line();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_4xx_with_one_line_never_a_500() {
    let b = id_business("bad");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let n = &b.name;
    let cases: Vec<(&str, String, Option<String>, u16)> = vec![
        ("GET", "/api/v1/businesses/nope/tasks".into(), None, 404),
        ("GET", "/api/v1/businesses/nope/dead".into(), None, 404),
        (
            "GET",
            "/api/v1/businesses/nope/search?prefix=x".into(),
            None,
            404,
        ),
        ("GET", "/api/v1/businesses/nope/tasks/x".into(), None, 404),
        (
            "POST",
            "/api/v1/businesses/nope/tasks".into(),
            Some(r#"{"id":"x","body":"b","in":"1s"}"#.into()),
            404,
        ),
        (
            "POST",
            "/api/v1/businesses/nope/dead/purge".into(),
            Some(r#"{"all":true}"#.into()),
            404,
        ),
        (
            "GET",
            format!("/api/v1/businesses/{n}/tasks?cursor=12:zz"),
            None,
            400,
        ),
        (
            "GET",
            format!("/api/v1/businesses/{n}/search?prefix=x&cursor=-1:0"),
            None,
            400,
        ),
        (
            "GET",
            format!("/api/v1/businesses/{n}/dead?limit=100000"),
            None,
            400,
        ),
        (
            "POST",
            format!("/api/v1/businesses/{n}/tasks/x/reschedule"),
            Some(r#"{"in":"forever"}"#.into()),
            400,
        ),
        (
            "POST",
            format!("/api/v1/businesses/{n}/tasks"),
            Some("{not json".into()),
            400,
        ),
        (
            "POST",
            format!("/api/v1/businesses/{n}/tasks"),
            Some(r#"{"id":"x","body":"b","in":"1s","extra":1}"#.into()),
            422,
        ),
        ("GET", "/api/v1/nothing/here".into(), None, 404),
    ];
    for (method, path, body, want) in cases {
        let a = call(c.port, method, &path, c.token(), body.as_deref()).await;
        assert_eq!(a.status, want, "{method} {path}: {}", a.text);
        a.error_line();
    }
    let search_long = format!("/api/v1/businesses/{n}/search?prefix={}", "p".repeat(2000));
    let a = api_get(c.port, &search_long).await;
    a.assert_error(400, "at most 1024");
    // A due range that starts after it ends picks nothing by construction.
    let backward = "\"from\" (2000) is after \"to\" (1000)";
    let a = api_get(
        c.port,
        &format!("/api/v1/businesses/{n}/tasks?from=2000&to=1000"),
    )
    .await;
    a.assert_error(400, backward);
    let a = call(
        c.port,
        "POST",
        &format!("/api/v1/businesses/{n}/bulk/cancel"),
        c.token(),
        Some(r#"{"from":"2000","to":"1000","dry_run":true}"#),
    )
    .await;
    a.assert_error(400, backward);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_assets_are_served_with_a_policy_that_runs_only_them() {
    let (_b, c) = console_of("page").await;
    for (path, kind, has) in [
        ("/", "text/html", "console.js"),
        ("/console.js", "text/javascript", "textContent"),
        ("/console.css", "text/css", "@media"),
    ] {
        let a = api_get(c.port, path).await;
        assert_eq!(a.status, 200, "{path}");
        let head = a.head.to_ascii_lowercase();
        assert!(
            head.contains(&format!("content-type: {kind}")),
            "{path}: {head}"
        );
        assert!(
            head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
            "{path}: {head}"
        );
        assert!(a.text.contains(has), "{path}");
    }
    // Data reaches the page as text only: the script never writes markup.
    let js = api_get(c.port, "/console.js").await.text;
    assert!(
        !js.contains("innerHTML")
            && !js.contains("insertAdjacentHTML")
            && !js.contains("document.write")
    );
    for probe in ["/metrics", "/healthz"] {
        assert_eq!(api_get(c.port, probe).await.status, 200, "{probe}");
    }
    // Ready once the broker's connection is up too, which the console
    // does not wait for (a bare run at 406b840 asked before it was: 503).
    let ready = eventually(Duration::from_secs(20), || async {
        api_get(c.port, "/readyz").await.status == 200
    })
    .await;
    assert!(
        ready,
        "/readyz: not 200 within 20 s: {}",
        api_get(c.port, "/readyz").await.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_with_text_that_is_not_hex_is_a_400_never_a_panic() {
    let (b, c) = console_of("cursor").await;
    for cursor in ["1:a%C3%A9b", "1:%C3%A9", "1:0%C3%A9"] {
        let path = format!("/api/v1/businesses/{}/tasks?cursor={cursor}", b.name);
        let a = api_get(c.port, &path).await;
        assert_eq!(a.status, 400, "{path}: {}", a.text);
        assert!(a.error_line().contains("\"cursor\""), "{}", a.text);
    }
    assert!(!c.daemon.logs().contains("panicked"), "{}", c.daemon.tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_another_host_name_or_a_write_from_another_origin_is_refused() {
    let b = id_business("host");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let port = c.port.to_string();
    let local = format!("localhost:{port}");
    for host in ["127.0.0.1", local.as_str(), "[::1]"] {
        let a = call_with(c.port, "GET", "/api/v1/businesses", &[("Host", host)], None).await;
        assert_eq!(a.status, 200, "Host {host}: {}", a.text);
    }
    // DNS rebinding: a page of evil.example whose name now points here.
    let rebound = format!("evil.example:{port}");
    for path in ["/api/v1/businesses", "/"] {
        let a = call_with(c.port, "GET", path, &[("Host", rebound.as_str())], None).await;
        assert_eq!(a.status, 403, "{path}: {}", a.text);
        assert!(a.text.contains("evil.example"), "{}", a.text);
    }
    let auth = format!("Bearer {TOKEN}");
    let write = format!("/api/v1/businesses/{}/tasks", b.name);
    let body = r#"{"id":"x","body":"b","in":"1h"}"#;
    let other = call_with(
        c.port,
        "POST",
        &write,
        &[
            ("Authorization", auth.as_str()),
            ("Origin", "http://evil.example"),
        ],
        Some(body),
    )
    .await;
    other.assert_error(403, "Origin");
    let own = format!("http://127.0.0.1:{port}");
    let host = format!("127.0.0.1:{port}");
    let same = call_with(
        c.port,
        "POST",
        &write,
        &[
            ("Host", host.as_str()),
            ("Authorization", auth.as_str()),
            ("Origin", own.as_str()),
        ],
        Some(body),
    )
    .await;
    assert_eq!(same.status, 201, "{}", same.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_acted_on_by_its_exact_bytes_whatever_its_text_or_size() {
    let b = BusinessSpec::random("exact");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let fam = family(&b.key);
    let big = vec![b'x'; 5000];
    // The binary a\xFF and the ASCII text `a\xff` look alike as text.
    for (m, reason) in [
        (b"a\xff".to_vec(), "binary"),
        (b"a\\xff".to_vec(), "ascii"),
        (big.clone(), "big"),
    ] {
        let _: () = redis::pipe()
            .zadd(&fam.dead, m.as_slice(), 1000)
            .hset(&fam.reasons, m.as_slice(), reason)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let dead = format!("/api/v1/businesses/{}/dead", b.name);
    let list = api_get(c.port, &dead).await;
    let handle = |reason: &str| {
        list.json["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["reason"] == reason)
            .and_then(|m| m["handle"].as_str())
            .unwrap_or_else(|| panic!("no handle for {reason}: {}", list.text))
            .to_string()
    };
    let purged = c
        .post(
            &format!("{dead}/purge"),
            json!({ "handle": handle("binary") }),
        )
        .await;
    assert_eq!(purged.json["count"], 1, "{}", purged.text);
    let left: Vec<Vec<u8>> = zrange(&mut r, &fam.dead).await;
    assert!(left.contains(&b"a\\xff".to_vec()), "the ASCII member went");
    assert!(
        !left.contains(&b"a\xff".to_vec()),
        "the binary member stayed"
    );
    // Over 4 KiB: shown cut, acted on whole.
    let count = c
        .post_untokened(
            &format!("{dead}/purge"),
            json!({ "handle": handle("big"), "dry_run": true }),
        )
        .await;
    assert_eq!(count.json["count"], 1, "{}", count.text);
    let gone = c
        .post(&format!("{dead}/purge"), json!({ "handle": handle("big") }))
        .await;
    assert_eq!(gone.json["count"], 1, "{}", gone.text);
    let bad = c
        .post(&format!("{dead}/purge"), json!({ "handle": "zz" }))
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    bad.error_line();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_read_token_every_read_needs_it_and_it_cannot_write() {
    const READ: &str = "test-read-token-0123456789";
    let b = id_business("roles");
    let c = ConsoleDaemon::start_with_tokens(&[&b], READ, TOKEN).await;
    let n = &b.name;
    let reads = [
        "/api/v1/businesses".to_string(),
        format!("/api/v1/businesses/{n}/histogram"),
        format!("/api/v1/businesses/{n}/tasks"),
        format!("/api/v1/businesses/{n}/tasks/x"),
        format!("/api/v1/businesses/{n}/search?prefix=x"),
        format!("/api/v1/businesses/{n}/dead"),
    ];
    for path in &reads {
        let none = api_get(c.port, path).await;
        assert_eq!(none.status, 401, "{path}: {}", none.text);
        assert!(!none.text.contains(READ) && !none.text.contains(TOKEN));
        let wrong = call(c.port, "GET", path, Some("not-it"), None).await;
        assert_eq!(wrong.status, 401, "{path}: {}", wrong.text);
        for token in [READ, TOKEN] {
            let ok = call(c.port, "GET", path, Some(token), None).await;
            assert!(ok.status == 200 || ok.status == 404, "{path}: {}", ok.text);
            assert_ne!(ok.status, 401, "{path}");
        }
    }
    let dead = format!("/api/v1/businesses/{n}/dead/purge");
    let count = json!({ "all": true, "dry_run": true });
    assert_eq!(api_post(c.port, &dead, None, &count).await.status, 401);
    assert_eq!(
        api_post(c.port, &dead, Some(READ), &count).await.status,
        200
    );
    let write = api_post(c.port, &dead, Some(READ), &json!({ "all": true })).await;
    write.assert_error(403, "admin token");
    let as_reader = call(c.port, "GET", "/api/v1/businesses", Some(READ), None).await;
    assert_eq!(
        (
            as_reader.json["can_write"].as_bool(),
            as_reader.json["read_only"].as_bool()
        ),
        (Some(false), Some(false)),
        "{}",
        as_reader.text
    );
    let as_admin = call(c.port, "GET", "/api/v1/businesses", Some(TOKEN), None).await;
    assert_eq!(as_admin.json["can_write"], true, "{}", as_admin.text);
    // The page and the probes carry no task data: they need no token.
    for path in ["/", "/console.js", "/metrics", "/healthz"] {
        assert_eq!(api_get(c.port, path).await.status, 200, "{path}");
    }
    let metrics = api_get(c.port, "/metrics").await.text;
    let logs = c.daemon.logs();
    for secret in [READ, TOKEN] {
        assert!(!metrics.contains(secret) && !logs.contains(secret));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_business_claims_nothing_keeps_its_work_and_says_so_everywhere() {
    let b = id_business("hold");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let n = &b.name;
    let pause = format!("/api/v1/businesses/{n}/pause");
    let resume = format!("/api/v1/businesses/{n}/resume");
    assert_eq!(c.post_untokened(&pause, json!({})).await.status, 401);
    let paused = c.post(&pause, json!({})).await;
    assert_eq!(paused.json["result"], "paused", "{}", paused.text);
    assert_eq!(paused.json["pause"]["by"], "admin_token", "{}", paused.text);
    let mut r = c.setup.redis.clone();
    let now = redis_now_ms(&mut r).await;
    let _: () = redis::pipe()
        .atomic()
        .hset(family(&b.key).body, "held-1", "the held task")
        .zadd(&b.key, "held-1", now)
        .query_async(&mut r)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(c.setup.inbox().all().is_empty(), "delivered while paused");
    assert_eq!(zcard(&mut r, &b.key).await, 1, "the pending task stays");
    let row = c.overview_of(n).await;
    assert_eq!(row["pause"]["by"], "admin_token", "{row}");
    let metrics = api_get(c.port, "/metrics").await.text;
    let gauge = format!("delayd_business_paused{{business=\"{n}\"}} 1");
    assert!(metrics.contains(&gauge), "no {gauge}");
    let cfg = c.setup.config.to_str().unwrap().to_string();
    let (code, out, err) = delayd(&["inspect", "-c", &cfg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("business \"{n}\" is paused")),
        "{out}"
    );

    // The command line resumes it as well: delivered at once.
    let (code, out, err) = delayd(&["resume", "-c", &cfg, n]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("resumed"), "{out}");
    c.setup.inbox().wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(c.setup.inbox().all()[0].body, b"the held task");
    let again = c.post(&resume, json!({})).await;
    assert_eq!(again.json["result"], "not_paused", "{}", again.text);
    let (code, out, _) = delayd(&["pause", "-c", &cfg, n]);
    assert_eq!(code, 0);
    assert!(out.contains("paused"), "{out}");
    // The overview is shared for a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let row = c.overview_of(n).await;
    assert_eq!(row["pause"]["by"], "cli", "{row}");
    let (code, _, _) = delayd(&["resume", "-c", &cfg, n]);
    assert_eq!(code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_is_in_the_audit_log_with_who_what_how_many_and_when() {
    let b = id_business("audited");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let n = &b.name;
    let mut r = c.setup.redis.clone();
    let before = redis_now_ms(&mut r).await;
    let tasks = format!("/api/v1/businesses/{n}/tasks");
    let made = c
        .post(&tasks, json!({ "id": "a-1", "body": "b", "in": "1h" }))
        .await;
    assert_eq!(made.status, 201, "{}", made.text);
    let gone = call(c.port, "DELETE", &format!("{tasks}/a-1"), c.token(), None).await;
    assert_eq!(gone.status, 200, "{}", gone.text);
    seed_dead(&mut r, &b.key, &[("d-1", "rejected"), ("d-2", "rejected")]).await;
    let dead = format!("/api/v1/businesses/{n}/dead/purge");
    let counted = c
        .post_untokened(&dead, json!({ "all": true, "dry_run": true }))
        .await;
    assert_eq!(counted.json["count"], 2);
    let purged = c.post(&dead, json!({ "reason": "rejected" })).await;
    assert_eq!(purged.json["count"], 2, "{}", purged.text);
    let cfg = c.setup.config.to_str().unwrap().to_string();
    assert_eq!(delayd(&["pause", "-c", &cfg, n]).0, 0);
    assert_eq!(delayd(&["resume", "-c", &cfg, n]).0, 0);

    let log = api_get(c.port, "/api/v1/audit?limit=1000").await;
    assert_eq!(log.status, 200, "{}", log.text);
    assert!(!log.text.contains(TOKEN));
    let mine = audit_entries(&log, n, before);
    let want: Vec<AuditEntry> = [
        ("cli", "resume", "every key", 1),
        ("cli", "pause", "every key", 1),
        ("admin_token", "purge", "reason containing \"rejected\"", 2),
        ("admin_token", "cancel", "id \"a-1\"", 1),
        ("admin_token", "schedule", "id \"a-1\"", 1),
    ]
    .iter()
    .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), *d))
    .collect();
    assert_eq!(mine, want, "newest first, the count first not among them");
    let page = api_get(c.port, "/api/v1/audit?limit=1").await;
    let cursor = page.json["cursor"].as_str().expect("a cursor").to_string();
    let older = api_get(c.port, &format!("/api/v1/audit?limit=1&cursor={cursor}")).await;
    assert_eq!(older.status, 200, "{}", older.text);
    assert_ne!(
        older.json["entries"][0]["id"],
        page.json["entries"][0]["id"]
    );
    let bad = api_get(c.port, "/api/v1/audit?cursor=nope").await;
    assert_eq!(bad.status, 400);
    bad.error_line();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_the_intake_consumer_queue_taken_in_and_rejected_beside_delivery() {
    let mut fed = id_business("fed");
    let intake_ex = unique("intake-ex");
    let queue = unique("intake-q");
    fed.extra = format!(
        "member = \"id\"\nproperties = \"standard\"\n[businesses.fed.intake]\nexchange = \"{intake_ex}\"\nqueue = \"{queue}\"\nmax_message_size = 64\n"
    );
    let plain = id_business("plain");
    let c = ConsoleDaemon::start(&[&fed, &plain], Some(TOKEN)).await;
    let up = eventually(Duration::from_secs(15), || async {
        c.overview_of("fed").await["intake"]["consuming"] == true
    })
    .await;
    assert!(up, "the intake consumer is not shown up");
    let bodies = [
        b"small one".to_vec(),
        b"small two".to_vec(),
        vec![b'x'; 200],
    ];
    for body in &bodies {
        let props = delayed(lapin::types::AMQPValue::LongInt(3_600_000));
        publish_props(&c.setup.ch, &intake_ex, "", body, props).await;
    }
    let counted = eventually(Duration::from_secs(15), || async {
        let i = &c.overview_of("fed").await["intake"];
        // The one over max_message_size is kept in the dead set: taken in
        // and counted rejected.
        i["taken_in_total"] == 3 && i["rejected_total"] == 1
    })
    .await;
    let row = c.overview_of("fed").await;
    assert!(counted, "{row}");
    let i = &row["intake"];
    assert_eq!(i["queue"], queue.as_str());
    assert_eq!(i["exchange"], intake_ex.as_str());
    assert_eq!(i["waiting_for_redis"], 0);
    assert!(i["queue_messages"].is_i64(), "{row}");
    assert!(row["rates"].get("taken_in_per_s").is_some(), "{row}");
    assert_eq!(
        row["pending"], 2,
        "the intake's tasks beside delivery's counts"
    );
    assert!(c.overview_of("plain").await["intake"].is_null());
}
