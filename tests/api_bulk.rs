//! Bulk actions, search by payload and per-business tokens through the
//! JSON API, against a running delayd and real Redis and RabbitMQ: the
//! count comes first, an action touches no more than the count confirmed,
//! a step is bounded and resumes from its cursor, and each call writes one
//! audit entry.

use delayd_test_support as common;

use common::*;
use serde_json::json;
use std::collections::HashSet;

const TOKEN: &str = "bulk-admin-token-0123456789";

fn id_business(name: &str) -> BusinessSpec {
    BusinessSpec::with_extra(name, "member = \"id\"")
}

/// Schedules `ids` due at `due_ms` with a body each, as a producer would.
async fn seed_pending(
    r: &mut redis::aio::MultiplexedConnection,
    key: &str,
    ids: &[String],
    due_ms: i64,
) {
    let fam = family(key);
    for chunk in ids.chunks(1000) {
        let mut p = redis::pipe();
        for id in chunk {
            p.hset(&fam.body, id, format!("body of {id}")).ignore();
            p.zadd(key, id, due_ms).ignore();
        }
        let _: () = p.query_async(r).await.unwrap();
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:05}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_by_due_range_counts_first_then_cancels_more_than_one_batch_and_no_more_than_confirmed(
) {
    let b = id_business("bulkcancel");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = redis().await;
    let now = redis_now_ms(&mut r).await;
    let (lo, hi) = (now + 86_400_000, now + 2 * 86_400_000);
    seed_pending(&mut r, &b.key, &ids("in-", 2500), lo + 1000).await;
    seed_pending(&mut r, &b.key, &ids("out-", 10), hi + 1000).await;
    let path = format!("/api/v1/businesses/{}/bulk/cancel", b.name);
    let range = json!({ "from": lo.to_string(), "to": hi.to_string() });

    let mut count = range.clone();
    count["dry_run"] = true.into();
    let a = c.post_untokened(&path, count).await;
    a.assert_ok_with("count", 2500);
    assert_eq!(zcard(&mut r, &b.key).await, 2510, "a count changes nothing");

    let a = c.post(&path, range.clone()).await;
    assert_eq!(
        a.status, 400,
        "acting without the count confirmed: {}",
        a.text
    );
    assert!(a.error_line().contains("\"confirm\""), "{}", a.text);

    // Members added after the count are not acted on beyond it.
    seed_pending(&mut r, &b.key, &ids("late-", 100), lo + 2000).await;
    let mut act = range.clone();
    act["confirm"] = 2500.into();
    let a = c.post(&path, act).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["touched"], 2500, "{}", a.text);
    assert_eq!(a.json["done"], true, "{}", a.text);
    assert_eq!(
        zcard(&mut r, &b.key).await,
        110,
        "10 outside the range and the 100 late ones stay"
    );
    assert_eq!(
        hlen(&mut r, &family(&b.key).body).await,
        110,
        "a cancelled id's body goes with it"
    );
    // The log is shared by every run: this run's entries name its range.
    let mut entries = audit_of(c.port, Some(TOKEN), &b.name, 0).await;
    entries.retain(|e| e.2.contains(&format!("due from {lo} ")));
    assert_eq!(
        entries.len(),
        1,
        "one audit entry for the call: {entries:?}"
    );
    let (by, action, what, n) = &entries[0];
    assert_eq!(
        (by.as_str(), action.as_str(), *n),
        ("admin_token", "bulk_cancel", 2500)
    );
    assert!(what.contains(&format!("due from {lo} to {hi}")), "{what}");
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_purge_by_reason_over_more_than_one_step_resumes_from_its_cursor_with_an_audit_entry_per_call(
) {
    let b = BusinessSpec::random("bulkrequeue");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = redis().await;
    let fam = family(&b.key);
    let now = redis_now_ms(&mut r).await;
    let n = 12_000;
    let tag = unique("NO_ROUTE");
    for chunk in (0..n + 50).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for i in chunk {
            let (m, reason) = if *i < n {
                (
                    format!("u{i}"),
                    format!("returned as unroutable (312 {tag}) after 5 attempts"),
                )
            } else {
                (format!("n{i}"), "no body".to_string())
            };
            p.zadd(&fam.dead, &m, now - 100_000 + *i as i64).ignore();
            p.hset(&fam.reasons, &m, &reason).ignore();
        }
        let _: () = p.query_async(&mut r).await.unwrap();
    }
    let path = format!("/api/v1/businesses/{}/bulk/purge", b.name);
    let a = c
        .post(&path, json!({ "reason": tag, "dry_run": true }))
        .await;
    assert_eq!(a.json["count"], n, "{}", a.text);

    let a = c.post(&path, json!({ "reason": tag, "confirm": n })).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let first = a.json["touched"].as_u64().unwrap();
    assert!(
        first > 1000 && first < n as u64,
        "one call is bounded, beyond one batch: {}",
        a.text
    );
    let mut cursor = a.json["cursor"]
        .as_str()
        .expect("a cursor to go on from")
        .to_string();
    let mut total = first;
    let mut calls = 1;
    while calls < 20 {
        let a = c
            .post(&path, json!({ "reason": tag, "cursor": cursor }))
            .await;
        assert_eq!(a.status, 200, "{}", a.text);
        total += a.json["touched"].as_u64().unwrap();
        calls += 1;
        match a.json["cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    assert_eq!(total, n as u64);
    assert_eq!(
        zcard(&mut r, &fam.dead).await,
        50,
        "only the other reason is left"
    );
    let mut entries = audit_of(c.port, Some(TOKEN), &b.name, 0).await;
    entries.retain(|e| e.2.contains(&tag));
    assert_eq!(entries.len(), calls, "{entries:?}");
    assert_eq!(entries.iter().map(|e| e.3).sum::<u64>(), n as u64);
    assert!(entries
        .iter()
        .all(|e| e.1 == "bulk_purge" && e.2.contains(&format!("reason containing \"{tag}\""))));
    assert_eq!(
        entries.iter().filter(|e| e.2.contains("(resumed)")).count(),
        calls - 1
    );

    let a = c
        .post(&path, json!({ "reason": tag, "cursor": "nonsense" }))
        .await;
    a.assert_error(400, "\"cursor\"");
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_reschedule_by_id_prefix_moves_only_the_ids_with_that_prefix() {
    let b = id_business("bulkmove");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = redis().await;
    let now = redis_now_ms(&mut r).await;
    let later = now + 86_400_000;
    seed_pending(&mut r, &b.key, &ids("order-7-", 1500), later).await;
    seed_pending(&mut r, &b.key, &ids("order-8-", 20), later).await;
    let path = format!("/api/v1/businesses/{}/bulk/reschedule", b.name);
    let a = c
        .post(&path, json!({ "prefix": "order-7-", "dry_run": true }))
        .await;
    assert_eq!(a.json["count"], 1500, "{}", a.text);
    let target = later + 3_600_000;
    let a = c
        .post(
            &path,
            json!({ "prefix": "order-7-", "confirm": 1500, "at_ms": target }),
        )
        .await;
    a.assert_ok_with("touched", 1500);
    let moved: Vec<(String, f64)> = zrange_scores(&mut r, &b.key).await;
    for (id, score) in &moved {
        let want = if id.starts_with("order-7-") {
            target
        } else {
            later
        };
        assert_eq!(*score as i64, want, "{id}");
    }
    assert_eq!(moved.len(), 1520);
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_requests_a_caller_can_fix_are_one_line_4xx_and_acting_needs_the_admin_token() {
    let b = id_business("bulkbad");
    let c = ConsoleDaemon::start_with_tokens(&[&b], "bulk-read-token-42", TOKEN).await;
    let base = format!("/api/v1/businesses/{}/bulk", b.name);
    let cases = [
        (
            "/explode",
            json!({ "prefix": "a", "dry_run": true }),
            404,
            "no bulk action",
        ),
        (
            "/cancel",
            json!({ "reason": "x", "dry_run": true }),
            400,
            "due range",
        ),
        (
            "/purge",
            json!({ "prefix": "x", "dry_run": true }),
            400,
            "\"reason\"",
        ),
        (
            "/cancel",
            json!({ "prefix": "", "dry_run": true }),
            400,
            "\"prefix\" is empty",
        ),
        (
            "/cancel",
            json!({ "from": "yesterday", "dry_run": true }),
            400,
            "\"from\"",
        ),
        (
            "/reschedule",
            json!({ "prefix": "a", "confirm": 1 }),
            400,
            "exactly one of \"in\"",
        ),
        (
            "/cancel",
            json!({ "prefix": "a", "confirm": 0 }),
            400,
            "\"confirm\" is 0",
        ),
        // Counting checks the new time too: acting would refuse it.
        (
            "/reschedule",
            json!({ "prefix": "a", "in": "forever", "dry_run": true }),
            400,
            "\"in\" \"forever\"",
        ),
        (
            "/reschedule",
            json!({ "prefix": "a", "in": "5s", "at": "1000", "dry_run": true }),
            400,
            "exactly one of \"in\"",
        ),
        (
            "/cancel",
            json!({ "from": "2000", "to": "1000", "dry_run": true }),
            400,
            "\"from\" (2000) is after \"to\" (1000)",
        ),
        (
            "/cancel",
            json!({ "prefix": "a", "colour": 1 }),
            422,
            "colour",
        ),
    ];
    for (p, body, status, says) in cases {
        let a = call(
            c.port,
            "POST",
            &format!("{base}{p}"),
            Some(TOKEN),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(a.status, status, "{p} {body}: {}", a.text);
        assert!(a.error_line().contains(says), "{p} {body}: {}", a.text);
    }
    let act = json!({ "prefix": "a", "confirm": 1 }).to_string();
    let a = call(
        c.port,
        "POST",
        &format!("{base}/cancel"),
        Some("bulk-read-token-42"),
        Some(&act),
    )
    .await;
    assert_eq!(a.status, 403, "the read token only counts: {}", a.text);
    let count = json!({ "prefix": "a", "dry_run": true }).to_string();
    let a = call(
        c.port,
        "POST",
        &format!("{base}/cancel"),
        Some("bulk-read-token-42"),
        Some(&count),
    )
    .await;
    assert_eq!(a.status, 200, "the read token counts: {}", a.text);
    let a = call(c.port, "POST", &format!("{base}/cancel"), None, Some(&act)).await;
    assert_eq!(a.status, 401, "{}", a.text);
    let a = call_with(
        c.port,
        "POST",
        &format!("{base}/cancel"),
        &[
            ("Authorization", &format!("Bearer {TOKEN}")),
            ("Origin", "http://evil.example"),
        ],
        Some(&act),
    )
    .await;
    assert_eq!(
        a.status, 403,
        "a write from another page's Origin: {}",
        a.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_by_body_finds_exactly_the_ids_whose_body_contains_the_text_page_by_page() {
    let b = id_business("bodysearch");
    let body_mode = BusinessSpec::random("bodymode");
    let c = ConsoleDaemon::start(&[&b, &body_mode], None).await;
    let mut r = redis().await;
    let now = redis_now_ms(&mut r).await;
    let fam = family(&b.key);
    let mut p = redis::pipe();
    for i in 0..3000 {
        let body = if i % 100 == 7 {
            format!("{{\"order\":{i},\"customer\":\"ACME-needle\"}}")
        } else {
            format!("{{\"order\":{i},\"customer\":\"other\"}}")
        };
        p.hset(&fam.body, format!("t{i}"), body).ignore();
        p.zadd(&b.key, format!("t{i}"), now + 86_400_000).ignore();
    }
    let _: () = p.query_async(&mut r).await.unwrap();
    let mut found = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut q = format!(
            "/api/v1/businesses/{}/search?body=ACME-needle&limit=10",
            b.name
        );
        if let Some(c) = &cursor {
            q.push_str(&format!("&cursor={c}"));
        }
        let a = api_get(c.port, &q).await;
        assert_eq!(a.status, 200, "{}", a.text);
        for t in a.json["tasks"].as_array().unwrap() {
            assert!(t["body"]["text"].as_str().unwrap().contains("ACME-needle"));
            assert_eq!(t["due_ms"], now + 86_400_000);
            found.insert(t["id"]["text"].as_str().unwrap().to_string());
        }
        cursor = a.json["cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "the search never reached the end");
    let want: std::collections::BTreeSet<String> = (0..3000)
        .filter(|i| i % 100 == 7)
        .map(|i| format!("t{i}"))
        .collect();
    assert_eq!(found, want);
    let a = api_get(
        c.port,
        &format!("/api/v1/businesses/{}/search?body=x", body_mode.name),
    )
    .await;
    a.assert_error(400, "member = \"body\"");
    let a = api_get(
        c.port,
        &format!("/api/v1/businesses/{}/search?body=x&prefix=y", b.name),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_token_opens_its_own_business_only_and_never_shows_in_logs() {
    let own = "tok-own-business-7f3a9c";
    let a_biz =
        BusinessSpec::with_extra("alpha", format!("member = \"id\"\nadmin_token = \"{own}\""));
    let b_biz = id_business("beta");
    let c = ConsoleDaemon::start(&[&a_biz, &b_biz], Some(TOKEN)).await;
    let get = |path: String, tok: Option<&'static str>| {
        let port = c.port;
        async move { call(port, "GET", &path, tok, None).await }
    };
    let post = |path: &'static str, tok: &'static str| {
        let port = c.port;
        async move { api_post(port, path, Some(tok), &json!({})).await }
    };
    let own_tok: &'static str = Box::leak(own.to_string().into_boxed_str());
    let a = get("/api/v1/businesses/alpha/tasks".into(), Some(own_tok)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let a = get("/api/v1/businesses/alpha/tasks".into(), None).await;
    assert_eq!(
        a.status, 401,
        "a business with a token of its own is closed to reads without one: {}",
        a.text
    );
    let a = get("/api/v1/businesses/beta/tasks".into(), Some(own_tok)).await;
    a.assert_error(403, "another business's token");
    let a = post("/api/v1/businesses/beta/pause", own_tok).await;
    assert_eq!(a.status, 403, "a write to another business: {}", a.text);
    let a = post("/api/v1/businesses/alpha/pause", own_tok).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let a = post("/api/v1/businesses/alpha/resume", TOKEN).await;
    assert_eq!(
        a.status, 200,
        "the global admin token still writes: {}",
        a.text
    );
    let a = get("/api/v1/businesses".into(), Some(own_tok)).await;
    let names: Vec<&str> = a.json["businesses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["alpha"],
        "the overview shows a business token its business only"
    );
    assert_eq!(a.json["can_write"], true);
    let entries = audit_of(c.port, Some(TOKEN), "alpha", 0).await;
    assert!(
        entries
            .iter()
            .any(|e| e.0 == "businesses.alpha.admin_token" && e.1 == "pause"),
        "the audit log names the token by its place, not its value: {entries:?}"
    );
    let a = get("/api/v1/audit".into(), Some(own_tok)).await;
    assert!(
        a.json["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["business"] == "alpha"),
        "{}",
        a.text
    );
    let metrics = http_get(c.port, "/metrics")
        .map(|m| m.1)
        .unwrap_or_default();
    for shown in [c.daemon.logs(), metrics, a.text] {
        assert!(!shown.contains(own), "the token leaked");
    }
}

/// The daemon's peak resident memory so far (`VmHWM`), in bytes.
fn peak_memory(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_over_large_bodies_raises_delayd_s_peak_memory_by_at_most_32_mib() {
    const BODIES: usize = 150;
    const BODY: usize = 1 << 20;
    let b = id_business("bigbodies");
    let c = ConsoleDaemon::start(&[&b], None).await;
    let mut r = redis().await;
    let due = redis_now_ms(&mut r).await + 86_400_000;
    let mut body = vec![b'x'; BODY];
    body[BODY / 2..BODY / 2 + 6].copy_from_slice(b"needle");
    for i in 0..BODIES {
        let _: () = redis::pipe()
            .hset(family(&b.key).body, format!("big-{i}"), &body)
            .zadd(&b.key, format!("big-{i}"), due)
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // Followed page by page, as a client would: a page ends early when
    // its time is up, which on a loaded machine may be before all 150.
    let before = peak_memory(&c.daemon);
    let mut tasks = Vec::new();
    let mut cursor = String::new();
    for _ in 0..BODIES {
        let path = format!(
            "/api/v1/businesses/{}/search?body=needle&limit=1000{cursor}",
            b.name
        );
        let a = api_get(c.port, &path).await;
        assert_eq!(a.status, 200, "{}", a.text.get(..300).unwrap_or(&a.text));
        tasks.extend(a.json["tasks"].as_array().unwrap().iter().cloned());
        match a.json["cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    let after = peak_memory(&c.daemon);
    let ids: HashSet<&str> = tasks
        .iter()
        .filter_map(|t| t["id"]["text"].as_str())
        .collect();
    assert_eq!(ids.len(), BODIES, "every matching body is found");
    for t in &tasks {
        assert_eq!(
            (
                t["body"]["bytes"].as_u64(),
                t["body"]["truncated"].as_bool()
            ),
            (Some(BODY as u64), Some(true)),
            "each body is shown cut, with its full size"
        );
        assert_eq!(t["body"]["text"].as_str().unwrap().len(), 4096);
    }
    let grew = after.saturating_sub(before);
    assert!(
        grew <= 32 << 20,
        "one search raised delayd's peak memory by {} MiB ({} to {} MiB) for {BODIES} matching bodies of {} MiB",
        grew >> 20,
        before >> 20,
        after >> 20,
        BODY >> 20
    );
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_up_a_task_with_a_64_mib_body_raises_delayd_s_peak_memory_by_at_most_16_mib() {
    const BODY: usize = 64 << 20;
    let b = id_business("hugebody");
    let c = ConsoleDaemon::start(&[&b], None).await;
    let mut r = redis().await;
    let due = redis_now_ms(&mut r).await + 86_400_000;
    let _: () = redis::pipe()
        .hset(family(&b.key).body, "huge", vec![b'y'; BODY])
        .zadd(&b.key, "huge", due)
        .query_async(&mut r)
        .await
        .unwrap();
    let before = peak_memory(&c.daemon);
    let a = api_get(c.port, &format!("/api/v1/businesses/{}/tasks/huge", b.name)).await;
    let after = peak_memory(&c.daemon);
    assert_eq!(a.status, 200, "{}", a.text.get(..300).unwrap_or(&a.text));
    assert_eq!(
        (
            a.json["body"]["bytes"].as_u64(),
            a.json["body"]["truncated"].as_bool(),
            a.json["body"]["text"].as_str().map(str::len)
        ),
        (Some(BODY as u64), Some(true), Some(4096)),
        "the body is shown cut, with its full size"
    );
    let grew = after.saturating_sub(before);
    assert!(
        grew <= 16 << 20,
        "one look-up raised delayd's peak memory by {} MiB ({} to {} MiB) for a body of {} MiB",
        grew >> 20,
        before >> 20,
        after >> 20,
        BODY >> 20
    );
    del_family(&mut r, &b.key).await;
}

/// A body-mode member of `size` bytes starting `name-`, unique by name.
fn big_member(name: &str, size: usize) -> Vec<u8> {
    padded_member(name, size, b'x')
}

/// A member like [`big_member`] padded with tabs, for a Redis a `MONITOR`
/// watches: Redis 7.0 prints each printable byte of every argument a script
/// writes with a `printf` of its own (`sdscatrepr`), about 75 ms per MiB on
/// the 2-core VM, which holds Redis and every call behind it; a tab takes
/// a plain copy (about 18 ms per MiB).
fn monitored_member(name: &str, size: usize) -> Vec<u8> {
    padded_member(name, size, b'\t')
}

fn padded_member(name: &str, size: usize, pad: u8) -> Vec<u8> {
    let mut m = format!("{name}-").into_bytes();
    m.resize(size, pad);
    m
}

/// Follows `path` page by page (its cursor in `cursor=`), collecting the
/// rows under `rows`.
async fn every_page(port: u16, path: &str, rows: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    for _ in 0..100 {
        let a = api_get(port, &format!("{path}{cursor}")).await;
        assert_eq!(a.status, 200, "{}", a.text.get(..300).unwrap_or(&a.text));
        out.extend(a.json[rows].as_array().unwrap().iter().cloned());
        match a.json["cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return out,
        }
    }
    panic!("{path}: more than 100 pages");
}

/// Every pending task of the business at `api`, listed `limit` a page,
/// and every one whose member starts `big-`, searched 1000 a page.
async fn listed_and_found(
    port: u16,
    api: &str,
    limit: usize,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let tasks = every_page(port, &format!("{api}/tasks?limit={limit}"), "tasks").await;
    let search = format!("{api}/search?prefix=big-&limit=1000");
    (tasks, every_page(port, &search, "tasks").await)
}

/// The distinct names (the text before the first '-') of rows' members.
fn names_of(rows: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> = rows
        .iter()
        .map(|t| {
            let text = t["member"]["text"].as_str().unwrap();
            text.split('-').take(2).collect::<Vec<_>>().join("-")
        })
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_searching_and_acting_on_1_mib_body_mode_members_raises_delayd_s_peak_memory_by_at_most_32_mib(
) {
    const PENDING: usize = 40;
    const DEAD: usize = 20;
    const SIZE: usize = 1 << 20;
    let b = BusinessSpec::random("bigmembers");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = redis().await;
    let fam = family(&b.key);
    // All pending members share one due time, and the dead ones one time
    // of death, so pages resume among members of the same score.
    let due = redis_now_ms(&mut r).await + 86_400_000;
    for i in 0..PENDING {
        let m = big_member(&format!("big-{i:02}"), SIZE);
        let _: i64 = query(&mut r, "ZADD", (&b.key, due, m)).await;
    }
    let _: i64 = query(&mut r, "ZADD", (&b.key, due, "small-00")).await;
    for i in 0..DEAD {
        let m = big_member(&format!("dead-{i:02}"), SIZE);
        let _: () = redis::pipe()
            .zadd(&fam.dead, &m, 1_767_323_045_000i64)
            .hset(&fam.reasons, &m, "too large: 1048576 bytes")
            .query_async(&mut r)
            .await
            .unwrap();
    }
    let before = peak_memory(&c.daemon);
    let api = format!("/api/v1/businesses/{}", b.name);

    let (tasks, found) = listed_and_found(c.port, &api, 7).await;
    let mut want: Vec<String> = (0..PENDING).map(|i| format!("big-{i:02}")).collect();
    want.push("small-00".into());
    assert_eq!(names_of(&tasks), want, "each pending member listed once");
    assert_eq!(names_of(&found), want[..PENDING], "each match found once");
    for t in tasks
        .iter()
        .chain(&found)
        .filter(|t| t["member"]["text"] != "small-00")
    {
        assert_eq!(
            (
                t["member"]["bytes"].as_u64(),
                t["member"]["truncated"].as_bool(),
                t["member"]["text"].as_str().map(str::len)
            ),
            (Some(SIZE as u64), Some(true), Some(4096)),
            "a large member is shown cut, with its full size"
        );
        assert!(
            t["handle"].as_str().unwrap().len() < 100,
            "its handle is short"
        );
    }

    let a = api_get(c.port, &format!("{api}/dead?limit=1000")).await;
    assert_eq!(a.status, 200, "{}", a.text.get(..300).unwrap_or(&a.text));
    let dead = a.json["members"].as_array().unwrap().clone();
    assert_eq!(dead.len(), DEAD);
    let one = dead[3]["handle"].as_str().unwrap();
    let name = dead[3]["member"]["text"].as_str().unwrap()[..7].to_string();
    let a = c
        .post(&format!("{api}/dead/requeue"), json!({ "handle": one }))
        .await;
    assert_eq!(a.json["count"], 1, "{}", a.text);
    // Due now, it is delivered at once: it left the dead set, the others stayed.
    let still = zscore(&mut r, &fam.dead, &big_member(&name, SIZE)).await;
    assert_eq!(still, None, "the member the handle named was requeued");
    assert_eq!(zcard(&mut r, &fam.dead).await, DEAD as u64 - 1);
    let by_reason = json!({ "reason": "too large", "dry_run": true });
    let a = c
        .post_untokened(&format!("{api}/dead/purge"), by_reason)
        .await;
    assert_eq!(
        a.json["count"].as_u64(),
        Some(DEAD as u64 - 1),
        "{}",
        a.text
    );
    let purge = json!({ "reason": "too large", "confirm": DEAD - 1 });
    let a = c.post(&format!("{api}/bulk/purge"), purge).await;
    assert_eq!(
        a.json["touched"].as_u64(),
        Some(DEAD as u64 - 1),
        "{}",
        a.text
    );
    assert_eq!(zcard(&mut r, &fam.dead).await, 0);

    let cancel = json!({ "prefix": "big-1", "dry_run": true });
    let a = c
        .post_untokened(&format!("{api}/bulk/cancel"), cancel)
        .await;
    assert_eq!(a.json["count"].as_u64(), Some(10), "{}", a.text);
    let a = c
        .post(
            &format!("{api}/bulk/cancel"),
            json!({ "prefix": "big-1", "confirm": 10 }),
        )
        .await;
    assert_eq!(a.json["touched"].as_u64(), Some(10), "{}", a.text);
    let later =
        json!({ "from": due.to_string(), "to": due.to_string(), "in": "2d", "confirm": 31 });
    let a = c.post(&format!("{api}/bulk/reschedule"), later).await;
    assert_eq!(a.json["touched"].as_u64(), Some(31), "{}", a.text);
    assert_eq!(zcard(&mut r, &b.key).await, PENDING as u64 + 1 - 10);

    let grew = peak_memory(&c.daemon).saturating_sub(before);
    assert!(
        grew <= 32 << 20,
        "listing, searching and acting on {} members of {} MiB raised delayd's peak memory by {} MiB",
        PENDING + DEAD,
        SIZE >> 20,
        grew >> 20
    );
    del_family(&mut r, &b.key).await;
}

/// Posts a bulk action at `path` and follows its cursor (the same body
/// with the cursor) to the end: the members touched in all.
async fn bulk_to_the_end(c: &ConsoleDaemon, path: &str, body: serde_json::Value) -> u64 {
    let mut a = c.post(path, body.clone()).await;
    let mut touched = 0;
    for _ in 0..100 {
        assert_eq!(a.status, 200, "{}", a.text.get(..300).unwrap_or(&a.text));
        touched += a.json["touched"].as_u64().unwrap();
        match a.json["cursor"].as_str() {
            Some(cursor) => {
                let mut next = body.clone();
                next["cursor"] = cursor.into();
                a = c.post(path, next).await
            }
            None => return touched,
        }
    }
    panic!("{path}: more than 100 steps");
}

/// The quoted arguments of one `MONITOR` line, unescaped, and whether a
/// script ran it (`[0 lua]`).
fn monitor_args(line: &str) -> (bool, Vec<String>) {
    let by_script = line.contains(" lua] ");
    let mut args = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => arg.push(chars.next().unwrap_or('\\')),
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    (by_script, args)
}

/// Whether the score `s` lies within the Redis score bounds `lo`..`hi`.
fn within(lo: &str, hi: &str, s: f64) -> bool {
    let bound = |b: &str, open_end: f64| -> (f64, bool) {
        let (open, v) = b.strip_prefix('(').map_or((false, b), |v| (true, v));
        let v = match v {
            "-inf" => f64::NEG_INFINITY,
            "+inf" | "inf" => f64::INFINITY,
            v => v.parse().unwrap_or(open_end),
        };
        (v, open)
    };
    let ((l, lo_open), (h, hi_open)) = (bound(lo, f64::INFINITY), bound(hi, f64::NEG_INFINITY));
    (if lo_open { s > l } else { s >= l }) && (if hi_open { s < h } else { s <= h })
}

/// How many of a set's members (`names`: each one's start), all at score
/// `score`, the command a script ran (`args`) hands to it at most: what
/// Redis copies into Lua (a `ZSCAN` only the members its `MATCH` takes).
fn members_handed(args: &[String], names: &[String], score: f64) -> usize {
    let n = match args.iter().position(|a| a.eq_ignore_ascii_case("MATCH")) {
        Some(i) => {
            let prefix = args[i + 1].trim_end_matches('*');
            names.iter().filter(|m| m.starts_with(prefix)).count()
        }
        None => names.len(),
    };
    let num = |i: usize| args.get(i).and_then(|a| a.parse::<i64>().ok());
    let after = |word: &str| {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case(word))
            .and_then(|i| num(i + 2).or(num(i + 1)))
    };
    let limit = |i: usize| {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case("LIMIT"))
            .and_then(|p| num(p + i))
    };
    let cmd = args[0].to_ascii_uppercase();
    let by_score = cmd == "ZRANGEBYSCORE" || args.iter().any(|a| a.eq_ignore_ascii_case("BYSCORE"));
    if cmd == "ZSCAN" || cmd == "HSCAN" {
        return (after("COUNT").unwrap_or(10).max(0) as usize).min(n);
    }
    if !cmd.starts_with("ZRANGE") {
        return 0;
    }
    if by_score {
        if !within(&args[2], &args[3], score) {
            return 0;
        }
        return limit(2).map_or(n, |c| (c.max(0) as usize).min(n));
    }
    let (Some(a), Some(b)) = (num(2), num(3)) else {
        return 0;
    };
    let b = if b < 0 {
        n as i64 + b
    } else {
        b.min(n as i64 - 1)
    };
    (b - a + 1).max(0) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_redis_call_of_listing_searching_or_acting_on_1_mib_members_copies_more_than_20_of_them()
{
    const PENDING: usize = 32;
    const DEAD: usize = 12;
    const SIZE: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::block_in_place(|| PrivateRedis::started_in_memory(dir.path()));
    let b = BusinessSpec::random("bigsteps");
    let c =
        ConsoleDaemon::start_on(&server.url(), &[&b], &[("DELAYD_HTTP__ADMIN_TOKEN", TOKEN)]).await;
    let c = ConsoleDaemon {
        token: Some(TOKEN.into()),
        ..c
    };
    let mut r = server.conn().await;
    let fam = family(&b.key);
    let due = redis_now_ms(&mut r).await + 86_400_000;
    const DIED: i64 = 1_767_323_045_000;
    for i in 0..PENDING {
        let m = monitored_member(&format!("big-{i:02}"), SIZE);
        let _: i64 = query(&mut r, "ZADD", (&b.key, due, m)).await;
    }
    for i in 0..DEAD {
        let m = monitored_member(&format!("dead-{i:02}"), SIZE);
        let _: () = redis::pipe()
            .zadd(&fam.dead, &m, DIED)
            .hset(&fam.reasons, &m, "too large: 1048576 bytes")
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // Every command from here on, with the commands each script ran.
    let monitor = redis::Client::open(server.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let into = lines.clone();
    let watch = tokio::spawn(async move {
        use futures::StreamExt;
        let mut s = monitor.into_on_message::<String>();
        while let Some(l) = s.next().await {
            into.lock().unwrap().push(l);
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let api = format!("/api/v1/businesses/{}", b.name);
    let want: Vec<String> = (0..PENDING).map(|i| format!("big-{i:02}")).collect();
    let dead: Vec<String> = (0..DEAD).map(|i| format!("dead-{i:02}")).collect();
    let (tasks, found) = listed_and_found(c.port, &api, 1000).await;
    assert_eq!(names_of(&tasks), want, "each pending member listed once");
    assert_eq!(names_of(&found), want, "each match found once");
    let a = api_get(c.port, &format!("{api}/dead?limit=1000")).await;
    assert_eq!(
        a.json["members"].as_array().map(Vec::len),
        Some(DEAD),
        "{}",
        a.text.get(..300).unwrap_or(&a.text)
    );
    let a = c
        .post_untokened(
            &format!("{api}/bulk/cancel"),
            json!({ "prefix": "big-1", "dry_run": true }),
        )
        .await;
    assert_eq!(a.json["count"].as_u64(), Some(10), "{}", a.text);
    let cancel = json!({ "prefix": "big-1", "confirm": 10 });
    let n = bulk_to_the_end(&c, &format!("{api}/bulk/cancel"), cancel).await;
    assert_eq!(n, 10, "cancelled");
    let later = json!({ "from": due.to_string(), "to": due.to_string(), "in": "2d", "confirm": PENDING - 10 });
    let n = bulk_to_the_end(&c, &format!("{api}/bulk/reschedule"), later).await;
    assert_eq!(n, PENDING as u64 - 10, "rescheduled");
    let purge = json!({ "reason": "too large", "confirm": DEAD });
    let n = bulk_to_the_end(&c, &format!("{api}/bulk/purge"), purge).await;
    assert_eq!(n, DEAD as u64, "purged");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    watch.abort();

    // Members each script call had Redis hand it, as its commands asked.
    let (mut most, mut worst, mut calls) = (0, String::new(), 0);
    let (mut sum, mut first) = (0, String::new());
    for line in lines.lock().unwrap().iter() {
        let (by_script, args) = monitor_args(line);
        if args.is_empty() {
            continue;
        }
        if !by_script {
            if sum > most {
                (most, worst) = (sum, first.clone());
            }
            calls += 1;
            (sum, first) = (0, String::new());
            continue;
        }
        let key = args.get(1).map(String::as_str).unwrap_or("");
        let handed = if key == b.key {
            members_handed(&args, &want, due as f64)
        } else if key == fam.dead {
            members_handed(&args, &dead, DIED as f64)
        } else {
            0
        };
        if first.is_empty() && handed > 0 {
            first = args
                .iter()
                .take(8)
                .map(|a| a.get(..40).unwrap_or(a))
                .collect::<Vec<_>>()
                .join(" ");
        }
        sum += handed;
    }
    if sum > most {
        (most, worst) = (sum, first);
    }
    assert!(calls > 10, "the monitor saw {calls} calls");
    assert!(
        most <= 20,
        "one script call had Redis copy {most} members of 1 MiB into Lua (its first read: {worst})"
    );
}
