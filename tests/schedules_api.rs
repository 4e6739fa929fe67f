//! The schedules view and its actions through the JSON API, against real
//! Redis and RabbitMQ: a paused schedule writes nothing on any instance and
//! stays paused across restarts; run now delivers exactly one extra
//! occurrence; the view shows cron, zone, next, last delivered and missed;
//! every write needs the admin token and is audited.

use delayd_test_support as common;

use std::time::Duration;

use common::*;
use serde_json::json;

const TOKEN: &str = "schedules-test-token-0123456789";

/// A business with one schedule `tick` (`cron`, in `tz`), delivered with
/// full properties so each message carries its due time.
fn scheduled(cron: &str, tz: &str, more: &str) -> BusinessSpec {
    // Its own name: the audit log is shared by every test on the server.
    let mut b = BusinessSpec::random(&unique("sched").replace('-', "_"));
    b.extra = format!(
        "properties = \"full\"\n[businesses.{}.recurring.tick]\ncron = \"{cron}\"\ntz = \"{tz}\"\nbody = \"tick\"\n{more}\n",
        b.name
    );
    b
}

/// The schedule `tick` as `GET …/schedules` on `port` shows it.
async fn tick_on(port: u16, business: &str) -> serde_json::Value {
    let a = api_get(port, &format!("/api/v1/businesses/{business}/schedules")).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.json["schedules"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "tick"))
        .cloned()
        .unwrap_or_else(|| panic!("no tick in {}", a.text))
}

/// The audit entries of `business` since `since`, oldest first: (by,
/// action, what, count).
async fn audited(port: u16, business: &str, since: i64) -> Vec<AuditEntry> {
    let mut out = audit_of(port, None, business, since).await;
    out.reverse();
    out
}

/// Occurrences of `tick` pending in Redis (written ahead).
async fn pending_ticks(r: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let all: Vec<String> = zrange(r, key).await;
    all.into_iter().filter(|m| m.starts_with("tick@")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_schedule_writes_nothing_on_any_instance_stays_paused_across_a_restart_and_resumes_from_now(
) {
    let b = scheduled("* * * * * *", "UTC", "write_ahead = \"3s\"");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let since = redis_now_ms(&mut r).await;
    let other_port = free_port(16000..20000, &[]);
    let listen = format!("127.0.0.1:{other_port}");
    let mut other = Daemon::start_with_env(&c.setup.config, &[("DELAYD_HTTP__LISTEN", &listen)]);
    let inbox = c.setup.inbox().clone();
    inbox.wait_for(3, Duration::from_secs(15)).await;
    let path = format!("/api/v1/businesses/{}/schedules/tick", b.name);

    let paused = c.post(&format!("{path}/pause"), json!({})).await;
    assert_eq!(paused.status, 200, "{}", paused.text);
    assert_eq!(paused.json["result"], "paused");
    let paused_at = redis_now_ms(&mut r).await;
    assert!(
        pending_ticks(&mut r, &b.key).await.is_empty(),
        "the occurrences written ahead were not taken back"
    );
    let again = c.post(&format!("{path}/pause"), json!({})).await;
    assert_eq!(again.json["result"], "paused_already", "{}", again.text);
    // Both instances' views say so: the state is in Redis.
    let shown = eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", other_port))
            .await
            .is_ok()
            && api_get(
                other_port,
                &format!("/api/v1/businesses/{}/schedules", b.name),
            )
            .await
            .json["schedules"][0]["paused"]["by"]
                == "admin_token"
    })
    .await;
    assert!(shown, "the other instance does not show the pause");
    assert_eq!(
        tick_on(c.port, &b.name).await["paused"]["by"],
        "admin_token"
    );

    // Nothing comes due on either instance, nor after a restart of both.
    inbox.settle(Duration::from_millis(1500)).await;
    let before = inbox.len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    other.signal(15);
    assert!(
        other.wait(Duration::from_secs(15)).success(),
        "{}",
        other.tail()
    );
    let mut other = Daemon::start_with_env(&c.setup.config, &[("DELAYD_HTTP__LISTEN", &listen)]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(inbox.len(), before, "a paused schedule was delivered");
    assert!(pending_ticks(&mut r, &b.key).await.is_empty());
    let late: Vec<i64> = inbox
        .all()
        .iter()
        .map(|m| m.due())
        .filter(|d| *d > paused_at)
        .collect();
    assert!(late.is_empty(), "occurrences after the pause: {late:?}");
    assert!(tick_on(other_port, &b.name).await["paused"].is_object());

    let resumed = c.post(&format!("{path}/resume"), json!({})).await;
    assert_eq!(resumed.json["result"], "resumed", "{}", resumed.text);
    let resumed_at = redis_now_ms(&mut r).await;
    inbox.wait_for(before + 3, Duration::from_secs(15)).await;
    let in_pause: Vec<i64> = inbox
        .all()
        .iter()
        .map(|m| m.due())
        .filter(|d| *d > paused_at && *d < resumed_at)
        .collect();
    assert!(
        in_pause.is_empty(),
        "the pause's occurrences came after the resume: {in_pause:?}"
    );
    assert!(tick_on(c.port, &b.name).await["paused"].is_null());
    let not = c.post(&format!("{path}/resume"), json!({})).await;
    assert_eq!(not.json["result"], "not_paused", "{}", not.text);

    assert_eq!(
        audited(c.port, &b.name, since).await,
        vec![
            (
                "admin_token".into(),
                "schedule_pause".into(),
                "tick".into(),
                1
            ),
            (
                "admin_token".into(),
                "schedule_pause".into(),
                "tick".into(),
                0
            ),
            (
                "admin_token".into(),
                "schedule_resume".into(),
                "tick".into(),
                1
            ),
            (
                "admin_token".into(),
                "schedule_resume".into(),
                "tick".into(),
                0
            ),
        ]
    );
    other.signal(15);
    assert!(
        other.wait(Duration::from_secs(15)).success(),
        "{}",
        other.tail()
    );
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_now_delivers_exactly_one_extra_occurrence_with_the_schedules_body() {
    // Once a year: nothing else comes due during the test.
    let b = scheduled("0 0 1 1 *", "Europe/Berlin", "");
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let since = redis_now_ms(&mut r).await;
    let path = format!("/api/v1/businesses/{}/schedules/tick/run", b.name);
    let ran = c.post(&path, json!({})).await;
    assert_eq!(ran.status, 200, "{}", ran.text);
    assert_eq!(ran.json["result"], "due_now");
    let id = ran.json["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("tick@run-"), "{id}");
    let inbox = c.setup.inbox().clone();
    inbox.wait_for(1, Duration::from_secs(10)).await;
    inbox.settle(Duration::from_secs(2)).await;
    let got = inbox.all();
    assert_eq!(got.len(), 1, "run now delivered {} messages", got.len());
    assert_eq!(got[0].body, b"tick");
    assert_eq!(got[0].due(), ran.json["due_ms"].as_i64().unwrap());
    assert_eq!(
        audited(c.port, &b.name, since).await,
        vec![(
            "admin_token".into(),
            "schedule_run".into(),
            "tick".into(),
            1
        )]
    );
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_shows_cron_zone_next_occurrences_the_last_delivered_and_the_missed() {
    let b = scheduled(
        "* * * * * *",
        "Europe/Berlin",
        "write_ahead = \"1s\"\ncatch_up = \"none\"",
    );
    let c = ConsoleDaemon::start(&[&b], Some(TOKEN)).await;
    let mut r = c.setup.redis.clone();
    let inbox = c.setup.inbox().clone();
    inbox.wait_for(3, Duration::from_secs(15)).await;
    let t = tick_on(c.port, &b.name).await;
    assert_eq!(t["cron"], "* * * * * *");
    assert_eq!(t["tz"], "Europe/Berlin");
    assert_eq!(t["catch_up"], "none");
    let next: Vec<i64> = t["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["due_ms"].as_i64().unwrap())
        .collect();
    assert_eq!(next.len(), 5);
    assert!(next.windows(2).all(|w| w[1] - w[0] == 1000), "{next:?}");
    assert!(
        t["next"][0]["local"].as_str().unwrap().contains("CE"),
        "{t}"
    );
    let last = t["last_delivered"]["due_ms"]
        .as_i64()
        .expect("a last delivered");
    assert!(
        inbox.all().iter().any(|m| m.due() == last),
        "the last delivered {last} never reached the queue"
    );
    assert_eq!(t["missed"], 0);

    // Every instance down for 4 s: catch_up = none skips and counts them.
    let ConsoleDaemon {
        setup,
        mut daemon,
        port,
        ..
    } = c;
    daemon.kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _d = Daemon::start_with_env(&setup.config, &[("DELAYD_HTTP__ADMIN_TOKEN", TOKEN)]);
    let counted = eventually(Duration::from_secs(20), || async {
        // Nothing answers until the new daemon listens.
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
            && api_get(port, &format!("/api/v1/businesses/{}/schedules", b.name))
                .await
                .json["schedules"][0]["missed"]
                .as_u64()
                .is_some_and(|n| n >= 2)
    })
    .await;
    let seen = api_get(port, &format!("/api/v1/businesses/{}/schedules", b.name)).await;
    assert!(
        counted,
        "the missed occurrences were not counted: {}\n{}",
        seen.text,
        _d.tail()
    );
    del_family(&mut r, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_writes_need_the_admin_token_a_known_schedule_and_their_own_origin() {
    const READ: &str = "schedules-read-token-0123456789";
    let b = scheduled("0 0 1 1 *", "UTC", "");
    let plain = BusinessSpec::random("plain");
    let c = ConsoleDaemon::start_with_tokens(&[&b, &plain], READ, TOKEN).await;
    let base = format!("/api/v1/businesses/{}/schedules", b.name);
    let pause = format!("{base}/tick/pause");
    let none = api_post(c.port, &pause, None, &json!({})).await;
    assert_eq!(none.status, 401, "{}", none.text);
    none.error_line();
    let reader = api_post(c.port, &pause, Some(READ), &json!({})).await;
    assert_eq!(reader.status, 403, "{}", reader.text);
    let unknown = api_post(c.port, &format!("{base}/nope/run"), Some(TOKEN), &json!({})).await;
    unknown.assert_error(404, "its schedules are tick");
    let nobiz_run = "/api/v1/businesses/nope/schedules/tick/run";
    let nobiz = api_post(c.port, nobiz_run, Some(TOKEN), &json!({})).await;
    assert_eq!(nobiz.status, 404);
    nobiz.error_line();
    let plain_run = format!("/api/v1/businesses/{}/schedules/tick/run", plain.name);
    let unscheduled = api_post(c.port, &plain_run, Some(TOKEN), &json!({})).await;
    unscheduled.assert_error(404, "no recurring schedules");
    let auth = format!("Bearer {TOKEN}");
    let foreign = call_with(
        c.port,
        "POST",
        &pause,
        &[("Authorization", &auth), ("Origin", "http://evil.example")],
        Some("{}"),
    )
    .await;
    assert_eq!(foreign.status, 403, "{}", foreign.text);
    let unread = call(c.port, "GET", &base, None, None).await;
    assert_eq!(unread.status, 401);
    let bad = call(c.port, "GET", &format!("{base}?next=0"), Some(READ), None).await;
    assert_eq!(bad.status, 400);
    bad.error_line();
    let empty = call(
        c.port,
        "GET",
        &format!("/api/v1/businesses/{}/schedules", plain.name),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.json["schedules"], json!([]));
    let listed = call(c.port, "GET", &base, Some(READ), None).await;
    assert!(
        listed.json["schedules"][0]["paused"].is_null(),
        "{}",
        listed.text
    );
}
