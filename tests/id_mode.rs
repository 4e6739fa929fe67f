//! Tasks addressed by id (`member = "id"`), and the commands that address a
//! task by its member in either mode: schedule, get, cancel, reschedule and
//! list against the real Redis; the producer snippets of docs/id-mode.md run
//! as written; the forecast gauge.

use delayd_test_support as common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use delayd::store::KeyFamily;

/// A business in id mode on a random key.
fn id_business(name: &str, extra: &str) -> BusinessSpec {
    let mut b = BusinessSpec::random(name);
    b.extra = format!("member = \"id\"\n{extra}");
    b
}

fn config(dir: &Path, businesses: &[&BusinessSpec]) -> String {
    write_config(dir, &redis_url(), &amqp_url(), businesses)
        .to_str()
        .unwrap()
        .to_string()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

async fn hget(conn: &mut redis::aio::MultiplexedConnection, key: &str, f: &str) -> Option<Vec<u8>> {
    query(conn, "HGET", (key, f)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_get_reschedule_cancel_round_trip_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let b = id_business("orders", "");
    let cfg = config(dir.path(), &[&b]);
    let fam = KeyFamily::new(&b.key);
    let mut redis = redis().await;

    let (code, out, err) = delayd(&[
        "schedule",
        "-c",
        &cfg,
        "orders",
        "--id",
        "o-1",
        "--in",
        "1h",
        "--json",
        "payload-1",
    ]);
    assert_eq!(code, 0, "schedule: {out}{err}");
    let due = json(&out)["due_ms"].as_i64().unwrap();
    assert_eq!(zscore(&mut redis, &b.key, "o-1").await, Some(due as f64));
    assert_eq!(
        hget(&mut redis, &fam.body, "o-1").await.as_deref(),
        Some(&b"payload-1"[..])
    );

    let (code, out, err) = delayd(&["get", "-c", &cfg, "orders", "o-1", "--json"]);
    assert_eq!(code, 0, "get: {out}{err}");
    let v = json(&out);
    assert_eq!(v["state"], "pending", "{out}");
    assert_eq!(v["due_ms"], due, "{out}");
    assert_eq!(v["body"], "payload-1", "{out}");
    assert_eq!(v["id"], "o-1", "{out}");

    let (code, out, err) = delayd(&[
        "reschedule",
        "-c",
        &cfg,
        "orders",
        "o-1",
        "--at-ms",
        "4102444800000",
        "--json",
    ]);
    assert_eq!(code, 0, "reschedule: {out}{err}");
    assert_eq!(json(&out)["result"], "rescheduled");
    assert_eq!(
        zscore(&mut redis, &b.key, "o-1").await,
        Some(4102444800000.0)
    );

    let (code, out, err) = delayd(&["cancel", "-c", &cfg, "orders", "o-1", "--json"]);
    assert_eq!(code, 0, "cancel: {out}{err}");
    assert_eq!(json(&out)["result"], "cancelled");
    assert_eq!(zscore(&mut redis, &b.key, "o-1").await, None);
    assert_eq!(
        hget(&mut redis, &fam.body, "o-1").await,
        None,
        "body left behind"
    );

    // Gone now: every command says so with exit code 4, and nothing comes back.
    let (code, out, _) = delayd(&["get", "-c", &cfg, "orders", "o-1", "--json"]);
    assert_eq!((code, json(&out)["state"].as_str()), (4, Some("not_found")));
    let (code, out, _) = delayd(&["cancel", "-c", &cfg, "orders", "o-1", "--json"]);
    assert_eq!(
        (code, json(&out)["result"].as_str()),
        (4, Some("not_found"))
    );
    let (code, out, _) = delayd(&[
        "reschedule",
        "-c",
        &cfg,
        "orders",
        "o-1",
        "--in",
        "1s",
        "--json",
    ]);
    assert_eq!(
        (code, json(&out)["result"].as_str()),
        (4, Some("not_found"))
    );
    assert_eq!(
        zscore(&mut redis, &b.key, "o-1").await,
        None,
        "reschedule re-added it"
    );
    assert_family_empty(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_refuses_a_missing_id_in_id_mode_and_an_id_in_body_mode() {
    let dir = tempfile::tempdir().unwrap();
    let ids = id_business("ids", "");
    let bodies = BusinessSpec::random("bodies");
    let cfg = config(dir.path(), &[&ids, &bodies]);
    let (code, _, err) = delayd(&["schedule", "-c", &cfg, "ids", "--in", "1s", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"ids\"") && err.contains("--id"), "{err}");
    let (code, _, err) = delayd(&[
        "schedule", "-c", &cfg, "bodies", "--id", "a", "--in", "1s", "x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"bodies\"") && err.contains("member = \"id\""),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_reschedule_of_an_in_flight_id_exit_3_and_leave_it_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let b = id_business("orders", "");
    let cfg = config(dir.path(), &[&b]);
    let mut redis = redis().await;
    let fam = family(&b.key);
    let (code, out, err) = delayd(&[
        "schedule", "-c", &cfg, "orders", "--id", "o-7", "--in", "0s", "p",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // A real claim, by the script delayd runs, puts it in flight.
    let store = delayd::store::Store::new(
        store_conn().await,
        fam.clone(),
        delayd::config::ScoreUnit::Millis,
    );
    let claim = store.claim(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claim.members.len(), 1);

    let (code, out, _) = delayd(&["get", "-c", &cfg, "orders", "o-7", "--json"]);
    assert_eq!(
        (code, json(&out)["state"].as_str()),
        (0, Some("in_flight")),
        "{out}"
    );
    let (code, out, _) = delayd(&["cancel", "-c", &cfg, "orders", "o-7"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("in flight: delivery under way"), "{out}");
    let (code, out, _) = delayd(&[
        "reschedule",
        "-c",
        &cfg,
        "orders",
        "o-7",
        "--in",
        "1h",
        "--json",
    ]);
    assert_eq!(
        (code, json(&out)["result"].as_str()),
        (3, Some("in_flight")),
        "{out}"
    );
    assert_eq!(zcard(&mut redis, &fam.inflight).await, 1);
    assert_eq!(
        zcard(&mut redis, &b.key).await,
        0,
        "reschedule re-added an in-flight id"
    );
    assert_eq!(
        hget(&mut redis, &fam.body, "o-7").await.as_deref(),
        Some(&b"p"[..]),
        "the delivery under way lost its body"
    );
    del_family(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_mode_addresses_a_task_by_its_body_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::with_extra("bodies", "shards = 3");
    let cfg = config(dir.path(), &[&b]);
    let mut redis = redis().await;
    let keys: Vec<String> = (0..3).map(|i| format!("{}:{i}", b.key)).collect();
    // A producer's own hash may pick any shard: put one body on each by hand.
    for (i, k) in keys.iter().enumerate() {
        let _: i64 = redis::cmd("ZADD")
            .arg(k)
            .arg(4102444800000i64 + i as i64)
            .arg(format!("body-{i}"))
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        let (code, out, err) =
            delayd(&["get", "-c", &cfg, "bodies", &format!("body-{i}"), "--json"]);
        assert_eq!(code, 0, "{out}{err}");
        let v = json(&out);
        assert_eq!(
            (v["state"].as_str(), v["key"].as_str()),
            (Some("pending"), Some(k.as_str()))
        );
        assert_eq!(v["body"], format!("body-{i}"), "{out}");
    }
    let (code, out, _) = delayd(&[
        "reschedule",
        "-c",
        &cfg,
        "bodies",
        "body-2",
        "--at-ms",
        "5",
        "--json",
    ]);
    assert_eq!(
        (code, json(&out)["key"].as_str()),
        (0, Some(keys[2].as_str())),
        "{out}"
    );
    assert_eq!(zscore(&mut redis, &keys[2], "body-2").await, Some(5.0));
    let (code, out, _) = delayd(&["list", "-c", &cfg, "bodies", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v = json(&out);
    let listed: Vec<&str> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["body"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["body-2", "body-0", "body-1"], "{out}");
    let (code, _, _) = delayd(&["cancel", "-c", &cfg, "bodies", "body-1"]);
    assert_eq!(code, 0);
    assert_eq!(zcard(&mut redis, &keys[1]).await, 0);
    for k in &keys {
        del_family(&mut redis, k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_in_due_order_within_a_range_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = id_business("orders", "");
    b.extra.push_str("shards = 2\n");
    let cfg = config(dir.path(), &[&b]);
    let mut redis = redis().await;
    // Equal due times too: the cursor must order within a score as Redis does.
    let base = 4102444800000i64;
    let mut want = Vec::new();
    for i in 0..25 {
        let due = base + (i / 3) as i64;
        let id = format!("t{i:02}");
        let at = due.to_string();
        let args = [
            "schedule", "-c", &cfg, "orders", "--id", &id, "--at-ms", &at, "b",
        ];
        let (code, out, err) = delayd(&args);
        assert_eq!(code, 0, "{out}{err}");
        if (base + 1..=base + 6).contains(&due) {
            want.push((due, id));
        }
    }
    want.sort();
    let mut got = Vec::new();
    let mut cursor: Option<String> = None;
    let (from, to) = ((base + 1).to_string(), (base + 6).to_string());
    for _ in 0..20 {
        let mut args = vec![
            "list", "-c", &cfg, "orders", "--limit", "4", "--from", &from, "--to", &to, "--json",
        ];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let (code, out, err) = delayd(&args);
        assert_eq!(code, 0, "{out}{err}");
        let v = json(&out);
        for t in v["tasks"].as_array().unwrap() {
            got.push((
                t["due_ms"].as_i64().unwrap(),
                t["id"].as_str().unwrap().to_string(),
            ));
        }
        match v["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(got, want);
    let (code, _, err) = delayd(&["list", "-c", &cfg, "orders", "--cursor", "garbage"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--cursor"), "{err}");
    for i in 0..2 {
        del_family(&mut redis, &format!("{}:{i}", b.key)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_paging_over_a_million_pending_returns_every_id_once() {
    const N: u64 = 1_000_000;
    let b = id_business("many", "");
    let mut redis = redis().await;
    // Pipelined ZADDs of 1000 members each: fast, and none of them holds
    // the shared server for long.
    for start in (0..N).step_by(20_000) {
        let mut pipe = redis::pipe();
        for chunk in (start..start + 20_000).step_by(1000) {
            let cmd = pipe.cmd("ZADD").arg(&b.key);
            for i in chunk..chunk + 1000 {
                cmd.arg(4102444800000u64 + i % 1000).arg(format!("id{i}"));
            }
            cmd.ignore();
        }
        let () = pipe.query_async(&mut redis).await.unwrap();
    }
    assert_eq!(zcard(&mut redis, &b.key).await, N);
    let dir = tempfile::tempdir().unwrap();
    let cfg =
        delayd::config::load(&write_config(dir.path(), &redis_url(), &amqp_url(), &[&b])).unwrap();
    let business = cfg.business("many").unwrap();
    let mut seen = vec![false; N as usize];
    let mut cursor: Option<String> = None;
    let mut last: Option<(i64, Vec<u8>)> = None;
    let mut pages = 0;
    loop {
        let page = delayd::tasks::list(
            &mut redis,
            business,
            delayd::tasks::Range::default(),
            10_000,
            cursor.as_deref(),
            None,
        )
        .await
        .unwrap();
        pages += 1;
        for t in &page.tasks {
            let i: usize = std::str::from_utf8(&t.member.head[2..])
                .unwrap()
                .parse()
                .unwrap();
            assert!(!seen[i], "id{i} listed twice");
            seen[i] = true;
            let here = (t.due_ms, t.member.head.clone());
            if let Some(prev) = &last {
                assert!(*prev < here, "out of order: {prev:?} then {here:?}");
            }
            last = Some(here);
        }
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    assert_eq!(missing, 0, "{missing} ids never listed");
    assert_eq!(pages, 100);
    del_family(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forecast_gauge_counts_pending_due_within_a_minute_an_hour_and_a_day() {
    let dir = tempfile::tempdir().unwrap();
    let b = id_business("orders", "");
    let mut path = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    // Port 0: the daemon logs the port it was given.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("listen = \"off\"", "listen = \"127.0.0.1:0\"");
    path = dir.path().join("with-http.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = path.to_str().unwrap();
    let mut redis = redis().await;
    for (id, when) in [("a", "30s"), ("b", "30m"), ("c", "12h"), ("d", "48h")] {
        let (code, out, err) = delayd(&[
            "schedule", "-c", cfg, "orders", "--id", id, "--in", when, "x",
        ]);
        assert_eq!(code, 0, "{out}{err}");
    }
    let daemon = Daemon::start(&path);
    let port = daemon.metrics_port().await;
    let lines: Vec<String> = [("1m", 1), ("1h", 2), ("1d", 3)]
        .iter()
        .map(|(window, n)| {
            format!("delayd_pending_due_within{{business=\"orders\",window=\"{window}\"}} {n}")
        })
        .collect();
    // The gauges appear with the first refresh after the listener opens.
    let mut body = String::new();
    let start = Instant::now();
    while !lines.iter().all(|l| body.contains(l.as_str()))
        && start.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        body = http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
    }
    for line in &lines {
        assert!(body.contains(line.as_str()), "no `{line}` in:\n{body}");
    }
    drop(daemon);
    del_family(&mut redis, &b.key).await;
}

/// Runs a snippet against a fresh key and checks what the docs say it does:
/// order-42 pending 60 s out with its body, order-43 cancelled with no body.
async fn check_snippet(program: &str, env: &[(&str, String)], file: &str, code: String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    std::fs::write(&path, code).unwrap();
    let key = unique("test:snippet");
    let fam = KeyFamily::new(&key);
    let mut redis = redis().await;
    let before = redis_now_ms(&mut redis).await;
    let mut cmd = std::process::Command::new(program);
    cmd.arg(&path)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("REDIS_URL", redis_url())
        .env("DELAYD_KEY", &key);
    let what = file.to_string();
    tokio::task::spawn_blocking(move || output_ok(cmd, &what))
        .await
        .unwrap();
    let after = redis_now_ms(&mut redis).await;
    let due = zscore(&mut redis, &key, "order-42")
        .await
        .expect("order-42 not pending") as i64;
    assert!(
        (before + 55_000..=after + 65_000).contains(&due),
        "order-42 due {due}, not ~60 s after {before}"
    );
    let body = hget(&mut redis, &fam.body, "order-42")
        .await
        .expect("order-42 has no body");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["order"], 42);
    assert_eq!(
        zscore(&mut redis, &key, "order-43").await,
        None,
        "order-43 not cancelled"
    );
    assert_eq!(
        hget(&mut redis, &fam.body, "order-43").await,
        None,
        "order-43's body left"
    );
    del_family(&mut redis, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_snippet_in_the_docs_schedules_reschedules_and_cancels_atomically() {
    let python = client("python");
    check_snippet(
        &python,
        &[],
        "snippet.py",
        doc_block("id-mode.md", "python"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_snippet_in_the_docs_schedules_reschedules_and_cancels_atomically() {
    let node_path = client("node");
    check_snippet(
        "node",
        &[("NODE_PATH", node_path)],
        "snippet.js",
        doc_block("id-mode.md", "js"),
    )
    .await;
}

// ---- delivery in id mode, with the daemon as users run it ----

struct Live {
    _dir: tempfile::TempDir,
    fam: KeyFamily,
    config: std::path::PathBuf,
    cfg: String,
    redis: redis::aio::MultiplexedConnection,
    amqp: lapin::Connection,
    inbox: Inbox,
}

/// Declares the exchange and a bound queue (unless `bind` is false),
/// consumes it, and writes the config.
/// Returns the business, its setup, and Redis's clock once it is ready.
async fn live(name: &str, extra: &str, bind: bool) -> (BusinessSpec, Live, i64) {
    let b = id_business(name, extra);
    let mut s = if bind {
        Setup::new(&[&b]).await
    } else {
        Setup::unbound(&[&b]).await
    };
    let now = redis_now_ms(&mut s.redis).await;
    let live = Live {
        fam: family(&b.key),
        cfg: s.config.to_str().unwrap().to_string(),
        inbox: s.inboxes.first().cloned().unwrap_or_default(),
        _dir: s.dir,
        config: s.config,
        redis: s.redis,
        amqp: s.amqp,
    };
    (b, live, now)
}

/// Schedules `items` (id, body) due at `due_ms`, each id and body in the same
/// transaction, a thousand per round trip.
async fn schedule_many(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    items: &[(String, Vec<u8>)],
    due_ms: i64,
) {
    let fam = KeyFamily::new(key);
    for chunk in items.chunks(1000) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let h = pipe.cmd("HSET").arg(&fam.body);
        for (id, body) in chunk {
            h.arg(id).arg(body.as_slice());
        }
        h.ignore();
        let z = pipe.cmd("ZADD").arg(key);
        for (id, _) in chunk {
            z.arg(due_ms).arg(id);
        }
        z.ignore();
        let () = pipe.query_async(conn).await.unwrap();
    }
}

/// The ids of an inbox's messages, with their bodies, checked unique.
fn by_id(inbox: &Inbox) -> std::collections::HashMap<String, Received> {
    let mut out = std::collections::HashMap::new();
    for r in inbox.all() {
        let body = String::from_utf8(r.body.clone()).unwrap();
        let id = body.split('|').next().unwrap().to_string();
        assert!(out.insert(id.clone(), r).is_none(), "{id} delivered twice");
    }
    out
}

/// Schedules one id with its body, due at `due_ms`.
async fn schedule_one(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    id: &str,
    body: &[u8],
    due_ms: i64,
) {
    schedule_many(conn, key, &[(id.to_string(), body.to_vec())], due_ms).await;
}

fn items(prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let id = format!("{prefix}{i}");
            let body = format!("{id}|body of {id}").into_bytes();
            (id, body)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_arrive_with_their_bodies_and_one_message_id_per_id_across_reschedules() {
    let (b, mut s, now) = live("orders", "", true).await;
    schedule_many(&mut s.redis, &b.key, &items("a", 2), now).await;
    // Scheduled for later, then moved to now: arrives once, at once.
    schedule_many(&mut s.redis, &b.key, &items("late", 1), now + 3_600_000).await;
    let (code, out, err) = delayd(&["reschedule", "-c", &s.cfg, "orders", "late0", "--in", "0s"]);
    assert_eq!(code, 0, "{out}{err}");
    let _d = Daemon::start(&s.config);
    s.inbox.wait_for(3, Duration::from_secs(20)).await;
    let first = by_id(&s.inbox);
    assert_eq!(first["a0"].body, b"a0|body of a0");
    assert_eq!(first["late0"].body, b"late0|body of late0");
    let id_a0 = first["a0"].message_id.clone().expect("message_id");
    assert_ne!(Some(&id_a0), first["a1"].message_id.as_ref());
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    // The same id scheduled again, at another time and with another body:
    // the consumer sees the same message_id.
    let now = redis_now_ms(&mut s.redis).await;
    schedule_one(&mut s.redis, &b.key, "a0", b"a0|again", now + 200).await;
    s.inbox.wait_for(4, Duration::from_secs(20)).await;
    let again = s
        .inbox
        .all()
        .into_iter()
        .find(|r| r.body == b"a0|again")
        .unwrap();
    assert_eq!(again.message_id, Some(id_a0));
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    s.inbox.settle(Duration::from_millis(300)).await;
    assert_eq!(s.inbox.len(), 4);
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_without_a_body_is_dead_with_the_reason_no_body_and_never_published() {
    let (b, mut s, now) = live("orders", "", true).await;
    let _: i64 = query(&mut s.redis, "ZADD", (&b.key, now, "ghost")).await;
    schedule_many(&mut s.redis, &b.key, &items("real", 1), now).await;
    let _d = Daemon::start(&s.config);
    s.inbox.wait_for(1, Duration::from_secs(20)).await;
    let dead = &s.fam.dead;
    let ghost_dead = eventually(Duration::from_secs(10), || {
        let mut r = s.redis.clone();
        async move { zscore(&mut r, dead, "ghost").await.is_some() }
    });
    assert!(ghost_dead.await, "ghost never reached the dead set");
    let (code, out, _) = delayd(&["get", "-c", &s.cfg, "orders", "ghost", "--json"]);
    let v = json(&out);
    assert_eq!(
        (code, v["state"].as_str(), v["reason"].as_str()),
        (0, Some("dead"), Some("no body")),
        "{out}"
    );
    s.inbox.settle(Duration::from_millis(500)).await;
    let got = s.inbox.all();
    assert_eq!(got.len(), 1, "only the id with a body is published");
    assert_eq!(got[0].body, b"real0|body of real0");
    let (code, _, _) = delayd(&["dead", "purge", "-c", &s.cfg, "orders"]);
    assert_eq!(code, 0);
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_id_keeps_its_body_and_a_requeue_delivers_it_with_that_body() {
    // Unroutable until a queue is bound: one attempt, then dead.
    let (b, mut s, now) = live(
        "orders",
        "max_attempts = 1\nretry_backoff = \"100ms\"",
        false,
    )
    .await;
    let dead_soon = items("d", 3);
    schedule_many(&mut s.redis, &b.key, &dead_soon, now).await;
    let _d = Daemon::start(&s.config);
    let died = eventually_zcard(&s.redis, &s.fam.dead, 3, Duration::from_secs(20)).await;
    assert!(died, "the unroutable ids never died");
    let (code, out, _) = delayd(&["get", "-c", &s.cfg, "orders", "d1", "--json"]);
    let v = json(&out);
    assert_eq!(
        (code, v["state"].as_str(), v["attempts"].as_u64()),
        (0, Some("dead"), Some(1)),
        "{out}"
    );
    assert_eq!(v["body"], "d1|body of d1", "a dead id lost its body: {out}");
    let ch = s.amqp.create_channel().await.unwrap();
    let inbox = bind_and_consume(&s.amqp, &ch, &b, &unique("q")).await;
    let (code, out, err) = delayd(&["dead", "requeue", "-c", &s.cfg, "orders"]);
    assert_eq!(code, 0, "{out}{err}");
    inbox.wait_for(3, Duration::from_secs(20)).await;
    let got = by_id(&inbox);
    assert_eq!(got["d2"].body, b"d2|body of d2");
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    inbox.settle(Duration::from_millis(300)).await;
    assert_eq!(inbox.len(), 3);
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_re_added_inside_the_dedup_window_is_dropped_and_outside_it_delivered() {
    let (b, mut s, now) = live("orders", "dedup_window = \"3s\"", true).await;
    schedule_one(&mut s.redis, &b.key, "x", b"x|first", now).await;
    let _d = Daemon::start(&s.config);
    s.inbox.wait_for(1, Duration::from_secs(20)).await;
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    let delivered_at = redis_now_ms(&mut s.redis).await;
    // Inside the window: claimed, dropped with its body, not delivered.
    schedule_one(&mut s.redis, &b.key, "x", b"x|inside", delivered_at).await;
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    assert_eq!(
        hget(&mut s.redis, &s.fam.body, "x").await,
        None,
        "dropped id kept its body"
    );
    s.inbox.settle(Duration::from_millis(500)).await;
    assert_eq!(
        s.inbox.len(),
        1,
        "re-added inside the window and delivered again"
    );
    // The record bounds its own memory: one entry, expiring with the window.
    let (card, ttl): (u64, i64) = redis::pipe()
        .zcard(&s.fam.delivered)
        .cmd("PTTL")
        .arg(&s.fam.delivered)
        .query_async(&mut s.redis)
        .await
        .unwrap();
    assert_eq!(card, 1);
    assert!(ttl > 0 && ttl <= 3000, "delivered record TTL {ttl}");
    // Outside the window: delivered.
    while redis_now_ms(&mut s.redis).await < delivered_at + 3100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = redis_now_ms(&mut s.redis).await;
    schedule_one(&mut s.redis, &b.key, "x", b"x|outside", now).await;
    s.inbox.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(s.inbox.all()[1].body, b"x|outside");
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(10)).await;
    // Nothing but the delivered record, which expires by itself.
    let gone = eventually_family_gone(&s.redis, &b.key, Duration::from_secs(10)).await;
    assert!(gone, "the key family did not empty once the window passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_zrem_cancel_leaves_an_orphan_body_that_the_sweep_deletes() {
    let (b, mut s, now) = live("orders", "lease = \"1s\"", true).await;
    schedule_many(&mut s.redis, &b.key, &items("o", 2), now + 3_600_000).await;
    let _: i64 = query(&mut s.redis, "ZREM", (&b.key, "o0")).await;
    let _d = Daemon::start(&s.config);
    let body = &s.fam.body;
    let orphan_gone = eventually(Duration::from_secs(15), || {
        let mut r = s.redis.clone();
        async move { hget(&mut r, body, "o0").await.is_none() }
    });
    assert!(orphan_gone.await, "the orphan body outlived three sweeps");
    assert!(
        hget(&mut s.redis, &s.fam.body, "o1").await.is_some(),
        "the sweep took a pending id's body"
    );
    del_family(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_claims_never_loses_an_id_nor_both_cancels_and_delivers_it() {
    const N: usize = 3000;
    let (b, mut s, _) = live("orders", "batch_size = 50\nscanners = 2", true).await;
    let cfg = delayd::config::load(&s.config).unwrap();
    let business = cfg.business("orders").unwrap().clone();
    let _d = Daemon::start(&s.config);
    // A warm-up delivery: the daemon is connected and claiming.
    let now = redis_now_ms(&mut s.redis).await;
    schedule_many(&mut s.redis, &b.key, &items("warm", 1), now).await;
    s.inbox.wait_for(1, Duration::from_secs(20)).await;
    let now = redis_now_ms(&mut s.redis).await;
    let all = items("r", N);
    // Due in a second: the cancels below start as the claims do, from the
    // other end of the set (claims take the lowest members first), so the
    // two meet somewhere in the middle.
    schedule_many(&mut s.redis, &b.key, &all, now + 1000).await;
    let mut order: Vec<&String> = all.iter().map(|(id, _)| id).collect();
    order.sort_by(|x, y| y.as_bytes().cmp(x.as_bytes()));
    while redis_now_ms(&mut s.redis).await < now + 1000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut cancelled = std::collections::HashSet::new();
    let mut in_flight = Vec::new();
    for id in order {
        let (_, outcome) = delayd::tasks::cancel(&mut s.redis, &business, id.as_bytes())
            .await
            .unwrap();
        match outcome {
            delayd::tasks::Cancelled::Cancelled => {
                cancelled.insert(id.clone());
            }
            delayd::tasks::Cancelled::InFlight => in_flight.push(id.clone()),
            _ => {}
        }
    }
    assert!(
        !cancelled.is_empty() && cancelled.len() < N,
        "no race happened: {} cancelled",
        cancelled.len()
    );
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(60)).await;
    s.inbox
        .wait_for(N + 1 - cancelled.len(), Duration::from_secs(60))
        .await;
    s.inbox.settle(Duration::from_millis(500)).await;
    let delivered = by_id(&s.inbox);
    for id in &cancelled {
        assert!(
            !delivered.contains_key(id),
            "{id} was cancelled and delivered"
        );
    }
    for id in &in_flight {
        assert!(
            delivered.contains_key(id),
            "{id} was in flight but never delivered"
        );
    }
    for (id, body) in &all {
        match delivered.get(id) {
            Some(r) => assert_eq!(&r.body, body),
            None => assert!(
                cancelled.contains(id),
                "{id} neither cancelled nor delivered: lost"
            ),
        }
    }
    assert_family_empty(&mut s.redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_mode_over_shards_delivers_every_id_once_and_cancels_in_any_shard() {
    let (_b, mut s, _) = live("orders", "shards = 4", true).await;
    let cfg = delayd::config::load(&s.config).unwrap();
    let business = cfg.business("orders").unwrap().clone();
    let keys = business.keys();
    let all = items("s", 2000);
    let now = redis_now_ms(&mut s.redis).await;
    for (i, k) in keys.iter().enumerate() {
        let mine: Vec<_> = all
            .iter()
            .filter(|(id, _)| delayd::tasks::shard_of(&keys, id.as_bytes()) == k)
            .cloned()
            .collect();
        assert!(!mine.is_empty(), "shard {i} got nothing");
        schedule_many(&mut s.redis, k, &mine, now + 1500).await;
    }
    // Cancelled through the business, wherever its shard is.
    for id in ["s0", "s1", "s2", "s3", "s4"] {
        let (code, out, err) = delayd(&["cancel", "-c", &s.cfg, "orders", id]);
        assert_eq!(code, 0, "{out}{err}");
    }
    let _d = Daemon::start(&s.config);
    s.inbox.wait_for(1995, Duration::from_secs(30)).await;
    for k in &keys {
        wait_drained(&mut s.redis, k, Duration::from_secs(10)).await;
    }
    s.inbox.settle(Duration::from_millis(500)).await;
    let got = by_id(&s.inbox);
    assert_eq!(got.len(), 1995);
    assert!(!got.contains_key("s3"));
    assert_eq!(got["s1999"].body, b"s1999|body of s1999");
    for k in &keys {
        assert_family_empty(&mut s.redis, k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_ids_drain_exactly_once_and_leave_the_key_family_empty() {
    const N: usize = 100_000;
    let (b, mut s, _) = live("orders", "", true).await;
    let all = items("h", N);
    let now = redis_now_ms(&mut s.redis).await;
    schedule_many(&mut s.redis, &b.key, &all, now).await;
    let _d = Daemon::start(&s.config);
    s.inbox.wait_for(N, Duration::from_secs(240)).await;
    wait_drained(&mut s.redis, &b.key, Duration::from_secs(30)).await;
    s.inbox.settle(Duration::from_millis(500)).await;
    let got = by_id(&s.inbox);
    assert_eq!(got.len(), N);
    for (id, body) in all.iter().step_by(997) {
        assert_eq!(&got[id].body, body);
    }
    assert_family_empty(&mut s.redis, &b.key).await;
}
