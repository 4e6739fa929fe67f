//! A business with tenants (docs/tenants.md), end to end against real Redis
//! and RabbitMQ: producers write each task into its tenant's sorted set and
//! the tenant into the index, as the wire format says; delayd releases every
//! member once, never early, and one tenant's backlog does not hold back
//! another tenant's members.

use delayd_test_support as common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::*;

/// The tenant keys of `key` (index, virtual times, the tenants' sets) that
/// still exist.
async fn tenant_keys_left(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    tenants: &[String],
) -> Vec<String> {
    let f = family(key);
    let mut names = vec![f.tenant_index(), f.tenant_clock()];
    for t in tenants {
        names.push(String::from_utf8(f.tenant_set(t.as_bytes())).unwrap());
    }
    let mut left = Vec::new();
    for k in names {
        let n: i64 = query(conn, "EXISTS", &k).await;
        if n == 1 {
            left.push(k);
        }
    }
    left
}

/// Asserts that no tenant key of `key` is left (see [`tenant_keys_left`]).
async fn assert_no_tenant_keys_left(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    tenants: &[String],
) {
    let left = tenant_keys_left(conn, key, tenants).await;
    assert!(left.is_empty(), "tenant keys left behind: {left:?}");
}

/// `count` members of `tenant`, due from `from` ms every `step` ms.
fn members(tenant: &str, count: usize, from: i64, step: i64) -> Vec<(f64, Vec<u8>)> {
    (0..count)
        .map(|i| {
            (
                (from + i as i64 * step) as f64,
                format!("{tenant}-{i}").into_bytes(),
            )
        })
        .collect()
}

fn bodies(items: &[(f64, Vec<u8>)]) -> HashSet<Vec<u8>> {
    items.iter().map(|(_, m)| m.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_members_are_delivered_once_and_never_early() {
    let (b, s, inbox, mut redis) = tenants_setup("tenants_once", "").await;
    let d = Daemon::start(&s.config);

    // Five tenants: some members already due, the rest over the next 2 s,
    // interleaved between tenants.
    let now = redis_now_ms(&mut redis).await;
    let tenants: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let mut want = HashSet::new();
    let mut due_of = HashMap::new();
    for (i, t) in tenants.iter().enumerate() {
        let items = members(t, 200, now - 100 + i as i64 * 3, 10);
        zadd_tenant(&mut redis, &b.key, t, &items).await;
        for (due, m) in &items {
            due_of.insert(m.clone(), *due as i64);
        }
        want.extend(bodies(&items));
    }

    wait_all(&inbox, &want, Duration::from_secs(30), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    let got = inbox.assert_each_once(&want, "a drain with tenants");
    for r in &got {
        let due = due_of[&r.body];
        assert_eq!(r.due(), due, "x-delayd-due is the due time written");
        assert!(
            r.at_ms >= due,
            "{} arrived {} ms early",
            String::from_utf8_lossy(&r.body),
            due - r.at_ms
        );
    }
    // Nothing is left behind: K, in flight, the tenants' sets, the index
    // and the virtual times are gone.
    wait_drained(&mut redis, &b.key, Duration::from_secs(10)).await;
    assert_no_tenant_keys_left(&mut redis, &b.key, &tenants).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_tenants_backlog_does_not_make_a_light_tenant_late() {
    let _turn = TIMING.lock().await;
    // max_rate makes the heavy tenant's 20,000 members a 5 s drain, so a
    // release in due order would hold every light member behind them for
    // seconds. Asserted is what the fair claim decides: no claim run once a
    // light member was due (on Redis's clock) moved heavy's members and
    // left it waiting. The milliseconds, taken at release (the earlier of
    // the member seen gone from its tenant's set and its arrival), are
    // printed: a loaded host stalls everything alike, which says nothing
    // of fairness.
    let (b, s, inbox, mut redis) = tenants_setup("tenants_light", "max_rate = 4000").await;
    let d = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let now = redis_now_ms(&mut redis).await;
    let heavy = members("heavy", 20_000, now + 500, 0);
    zadd_tenant(&mut redis, &b.key, "heavy", &heavy).await;
    // 20 light tenants, 4 members each, due one after another from 1 s to
    // 4 s after the heavy burst, while its backlog is still there.
    let mut light = Vec::new();
    let tenants: Vec<String> = (0..20).map(|i| format!("light{i}")).collect();
    for (i, t) in tenants.iter().enumerate() {
        let items: Vec<(f64, Vec<u8>)> = (0..4)
            .map(|j| {
                let due = now + 1500 + (j * 20 + i) as i64 * 3000 / 80;
                (due as f64, format!("{t}-{j}").into_bytes())
            })
            .collect();
        zadd_tenant(&mut redis, &b.key, t, &items).await;
        light.extend(items);
    }
    let named: Vec<(&str, String)> = light
        .iter()
        .enumerate()
        .map(|(k, (_, m))| {
            let member = String::from_utf8(m.clone()).unwrap();
            (tenants[k / 4].as_str(), member)
        })
        .collect();
    let released = watch_released(&redis, &b.key, &named, "heavy");
    let mut want = bodies(&heavy);
    want.extend(bodies(&light));

    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    let got = inbox.assert_each_once(&want, "a drain with tenants");
    let released = released.await.unwrap();
    let mut late: Vec<i64> = named
        .iter()
        .zip(&released.at)
        .map(|((_, m), at)| {
            let r = got.iter().find(|r| r.body == m.as_bytes()).unwrap();
            assert!(r.at_ms >= r.due(), "a light member arrived early");
            (*at).min(r.at_ms) - r.due()
        })
        .collect();
    late.sort();
    let heavy_last = last_arrival(&got, b"heavy-");
    let last_light_due = light.iter().map(|l| l.0 as i64).max().unwrap();
    // The backlog outlived the light members: had they waited behind it,
    // the last would have been seconds late.
    assert!(
        heavy_last > last_light_due + 300,
        "the heavy drain ended before the light members came due: the test shows nothing"
    );
    eprintln!(
        "light lateness ms at release: p50 {} p99 {} max {}; heavy drained {} ms after its due time; heavy members released past a due light one: {}",
        late[late.len() / 2],
        late[late.len() * 99 / 100],
        late.last().unwrap(),
        heavy_last - (now + 500),
        released.passed_over_by.iter().sum::<u64>()
    );
    for ((_, member), passed) in named.iter().zip(&released.passed_over_by) {
        assert_eq!(
            *passed, 0,
            "claims run after {member} was due released {passed} of the heavy tenant's members and left it waiting"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_then_restart_delivers_every_tenants_member() {
    let (b, s, inbox, mut redis) =
        tenants_setup("tenants_kill", "max_rate = 3000\nlease = \"2s\"").await;

    let now = redis_now_ms(&mut redis).await;
    let tenants: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
    let mut want = HashSet::new();
    for t in &tenants {
        let items = members(t, 3000, now, 0);
        zadd_tenant(&mut redis, &b.key, t, &items).await;
        want.extend(bodies(&items));
    }
    let mut d = Daemon::start(&s.config);
    wait_n(&inbox, 2000, Duration::from_secs(30), &d).await;
    d.kill();
    assert!(
        inbox.bodies().len() < want.len(),
        "the kill came after the drain"
    );
    let d = Daemon::start(&s.config);

    wait_all(&inbox, &want, Duration::from_secs(60), &d).await;
    assert_eq!(inbox.bodies(), want, "nothing but the scheduled members");
    // What the killed process held comes back within a lease plus a sweep.
    wait_family_empty(&mut redis, &b.key, Duration::from_secs(15)).await;
    assert_no_tenant_keys_left(&mut redis, &b.key, &tenants).await;
}

/// `delayd schedule --tenant` on a business with tenants writes the task
/// into that tenant's set (without `--tenant`, into "default") and the
/// tenant into the index, nothing into `K`; each is delivered once, not
/// before its due time. On a business without tenants `--tenant` is
/// refused with one line and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_with_a_tenant_writes_into_its_set_and_is_delivered_once() {
    let b = BusinessSpec::with_extra("tenants_cli", "tenants = true");
    let plain = BusinessSpec::with_extra("plain_cli", "");
    let s = Setup::new(&[&b, &plain]).await;
    let (inbox, mut redis) = (s.inbox().clone(), s.redis.clone());
    let cfg = s.config.to_str().unwrap();
    let acme = unique("acme-task");
    let other = unique("default-task");
    let (code, _, err) = delayd(&[
        "schedule",
        "-c",
        cfg,
        "tenants_cli",
        "--tenant",
        "acme",
        "--in",
        "1s",
        &acme,
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = delayd(&["schedule", "-c", cfg, "tenants_cli", "--in", "1s", &other]);
    assert_eq!(code, 0, "{err}");
    let f = family(&b.key);
    let in_acme = zscore(&mut redis, f.tenant_set(b"acme"), &acme).await;
    let in_default = zscore(&mut redis, f.tenant_set(b"default"), &other).await;
    assert!(
        in_acme.is_some() && in_default.is_some(),
        "{in_acme:?} {in_default:?}"
    );
    let mut index: Vec<String> = zrange(&mut redis, &f.tenant_index()).await;
    index.sort();
    assert_eq!(index, vec!["acme".to_string(), "default".to_string()]);
    assert_eq!(zcard(&mut redis, &b.key).await, 0, "nothing in K");

    let (code, _, err) = delayd(&[
        "schedule",
        "-c",
        cfg,
        "plain_cli",
        "--tenant",
        "acme",
        "--in",
        "1s",
        "x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("has no tenants"), "{err}");
    assert_eq!(zcard(&mut redis, &plain.key).await, 0, "nothing written");

    let d = Daemon::start(&s.config);
    let want: HashSet<Vec<u8>> = [acme.clone().into_bytes(), other.clone().into_bytes()].into();
    wait_all(&inbox, &want, Duration::from_secs(15), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    for r in inbox.assert_each_once(&want, "schedule --tenant") {
        let due = if r.body == acme.as_bytes() {
            in_acme
        } else {
            in_default
        };
        assert!(r.at_ms >= due.unwrap() as i64, "delivered early");
    }
}

/// By id, a task still in its tenant's set is found, moved and cancelled
/// as one in `K` is: `get` shows it pending, `reschedule` moves it (it is
/// delivered once, not before its new time), `cancel` removes it (it is
/// never delivered, and a second cancel finds nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_id_get_reschedule_and_cancel_reach_a_task_in_its_tenants_set() {
    let b = BusinessSpec::with_extra("tenants_by_id", "tenants = true");
    let s = Setup::new(&[&b]).await;
    let inbox = s.inbox().clone();
    let cfg = s.config.to_str().unwrap();
    let run = |args: &[&str]| {
        let (code, out, err) = delayd(args);
        (code, format!("{out}{err}"))
    };
    let (kept, gone) = (unique("kept"), unique("gone"));
    for m in [&kept, &gone] {
        let (code, out) = run(&[
            "schedule",
            "-c",
            cfg,
            "tenants_by_id",
            "--tenant",
            "acme",
            "--in",
            "1h",
            m,
        ]);
        assert_eq!(code, 0, "{out}");
    }
    let (code, out) = run(&["get", "-c", cfg, "tenants_by_id", &kept]);
    assert_eq!(code, 0, "a task in its tenant's set is found: {out}");
    assert!(out.contains("pending"), "{out}");
    let (code, out) = run(&[
        "reschedule",
        "-c",
        cfg,
        "tenants_by_id",
        &kept,
        "--in",
        "2s",
    ]);
    assert_eq!(code, 0, "{out}");
    let moved_at = redis_now_ms(&mut s.redis.clone()).await;
    let (code, out) = run(&["cancel", "-c", cfg, "tenants_by_id", &gone]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["cancel", "-c", cfg, "tenants_by_id", &gone]);
    assert_eq!(code, 4, "a second cancel finds nothing pending: {out}");

    let d = Daemon::start(&s.config);
    let want: HashSet<Vec<u8>> = [kept.clone().into_bytes()].into();
    wait_all(&inbox, &want, Duration::from_secs(15), &d).await;
    inbox.settle(Duration::from_millis(1500)).await;
    for r in inbox.assert_each_once(&want, "a rescheduled task, and no cancelled one") {
        assert!(
            r.at_ms >= moved_at + 1900,
            "delivered before its new due time"
        );
    }
}

const ADMIN: &str = "tok-tenants-admin-61c0de";

/// `delayd tenants` with `args` on `cfg`'s business, asserting it succeeds;
/// its output.
fn tenants_cli(cfg: &std::path::Path, business: &str, args: &[&str]) -> String {
    let mut all = vec!["tenants", "-c", cfg.to_str().unwrap(), business];
    all.extend_from_slice(args);
    let (code, out, err) = delayd(&all);
    assert_eq!(code, 0, "delayd {all:?}: {err}");
    out
}

/// `POST …/tenants/{tenant}/{action}` with `token`; the answer's
/// `result`, or its status when it has none.
async fn tenant_action(
    port: u16,
    business: &str,
    tenant: &str,
    action: &str,
    token: Option<&str>,
) -> String {
    let path = format!("/api/v1/businesses/{business}/tenants/{tenant}/{action}");
    let a = call(port, "POST", &path, token, None).await;
    a.json["result"]
        .as_str()
        .map_or_else(|| a.status.to_string(), str::to_string)
}

/// When the last message whose body starts with `prefix` arrived, epoch ms.
fn last_arrival(got: &[Received], prefix: &[u8]) -> i64 {
    got.iter()
        .filter(|r| r.body.starts_with(prefix))
        .map(|r| r.at_ms)
        .max()
        .unwrap_or_else(|| panic!("no {} arrived", String::from_utf8_lossy(prefix)))
}

/// A setup for one business with tenants, named `name`, with the `more`
/// config lines; with its inbox and a Redis connection.
async fn tenants_setup(
    name: &str,
    more: &str,
) -> (
    BusinessSpec,
    Setup,
    Inbox,
    redis::aio::MultiplexedConnection,
) {
    let b = BusinessSpec::with_extra(name, format!("tenants = true\n{more}"));
    let s = Setup::new(&[&b]).await;
    let (inbox, redis) = (s.inbox().clone(), s.redis.clone());
    (b, s, inbox, redis)
}

/// A console over one business with tenants, named `name`, whose writes
/// take the `ADMIN` token; with its inbox and a Redis connection.
async fn tenants_console(
    name: &str,
) -> (
    BusinessSpec,
    ConsoleDaemon,
    Inbox,
    redis::aio::MultiplexedConnection,
) {
    let b = BusinessSpec::with_extra(name, "tenants = true");
    let c = ConsoleDaemon::start(&[&b], Some(ADMIN)).await;
    let (inbox, redis) = (c.setup.inbox().clone(), c.setup.redis.clone());
    (b, c, inbox, redis)
}

/// Pauses `tenant` of `b` through the API, asserting it says so.
async fn pause_tenant(c: &ConsoleDaemon, b: &BusinessSpec, tenant: &str) {
    let said = tenant_action(c.port, &b.name, tenant, "pause", Some(ADMIN)).await;
    assert_eq!(said, "paused", "pause {tenant}");
}

/// One tenant's row of `GET …/tenants`.
async fn tenant_row(port: u16, business: &str, tenant: &str) -> serde_json::Value {
    let path = format!("/api/v1/businesses/{business}/tenants?limit=1000");
    let a = call(port, "GET", &path, None, None).await;
    assert_eq!(a.status, 200, "{}", a.text);
    find_row(&a.json["rows"], "tenant", tenant).unwrap_or(serde_json::Value::Null)
}

/// A paused tenant's members stay in its set, due, while every other
/// tenant's are delivered; the listing shows it paused and overdue; once
/// resumed each is delivered once. From the API and from the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tenant_is_held_while_the_others_are_delivered_then_resume_releases_it() {
    let (b, c, inbox, mut redis) = tenants_console("tenants_pause").await;
    let act = |action: &'static str, token| tenant_action(c.port, &b.name, "held", action, token);

    assert_eq!(
        act("pause", None).await,
        "401",
        "a pause needs the admin token"
    );
    assert_eq!(act("pause", Some(ADMIN)).await, "paused");
    assert_eq!(act("pause", Some(ADMIN)).await, "paused_already");
    tenants_cli(&c.setup.config, &b.name, &["--pause", "cli-held"]);

    let now = redis_now_ms(&mut redis).await;
    let held = members("held", 50, now + 200, 2);
    let cli_held = members("cli-held", 20, now + 200, 2);
    let free = members("free", 50, now + 200, 2);
    for (t, items) in [("held", &held), ("cli-held", &cli_held), ("free", &free)] {
        zadd_tenant(&mut redis, &b.key, t, items).await;
    }
    wait_all(&inbox, &bodies(&free), Duration::from_secs(20), &c.daemon).await;
    // Well past their due time, the paused tenants' members are all still
    // in their sets, and none was delivered.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let f = family(&b.key);
    for (t, n) in [("held", 50), ("cli-held", 20)] {
        let left: i64 = query(&mut redis, "ZCARD", f.tenant_set(t.as_bytes())).await;
        assert_eq!(left, n, "tenant {t}'s members left its set while paused");
    }
    assert!(
        inbox
            .all()
            .iter()
            .all(|r| !r.body.starts_with(b"held-") && !r.body.starts_with(b"cli-held-")),
        "a paused tenant's member was delivered"
    );
    let row = tenant_row(c.port, &b.name, "held").await;
    assert_eq!(row["pending"], 50, "{row}");
    assert_eq!(row["due"], 50, "{row}");
    assert_eq!(row["paused"]["by"], "admin_token", "{row}");
    assert!(row["oldest_overdue_ms"].as_u64().unwrap() >= 1000, "{row}");
    let listed: serde_json::Value =
        serde_json::from_str(&tenants_cli(&c.setup.config, &b.name, &["--json"])).unwrap();
    let cli_row = listed["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tenant"] == "cli-held")
        .cloned()
        .unwrap();
    assert_eq!(cli_row["paused"]["by"], "cli", "{listed}");
    assert_eq!(listed["paused"], 2, "{listed}");

    assert_eq!(act("resume", Some(ADMIN)).await, "resumed");
    let out = tenants_cli(&c.setup.config, &b.name, &["--resume", "cli-held"]);
    assert!(out.contains("resumed"), "{out}");
    let mut want = bodies(&free);
    want.extend(bodies(&held));
    want.extend(bodies(&cli_held));
    wait_all(&inbox, &want, Duration::from_secs(20), &c.daemon).await;
    inbox.settle(Duration::from_millis(500)).await;
    inbox.assert_each_once(&want, "a tenant paused, then resumed");
    assert_eq!(act("resume", Some(ADMIN)).await, "not_paused");
    let audit = call(c.port, "GET", "/api/v1/audit?limit=1000", None, None).await;
    let actions: Vec<&str> = audit.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["business"] == b.name.as_str())
        .filter_map(|e| e["action"].as_str())
        .collect();
    for want in ["tenant_pause", "tenant_resume"] {
        assert!(
            actions.contains(&want),
            "no {want} in the audit log: {actions:?}"
        );
    }
}

/// Two saturated tenants share a `max_rate` by the weight set at run time,
/// from the API and then from the CLI, with no restart: 3:1 one way, then
/// 3:1 the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_set_at_run_time_changes_the_shares_of_two_saturated_tenants() {
    let _turn = TIMING.lock().await;
    let b = BusinessSpec::with_extra("tenants_weight", "tenants = true\nmax_rate = 1000");
    let c = ConsoleDaemon::start(&[&b], Some(ADMIN)).await;
    let (inbox, mut redis) = (c.setup.inbox().clone(), c.setup.redis.clone());
    let path = format!("/api/v1/businesses/{}/tenants/a/weight", b.name);
    let a = c.post(&path, serde_json::json!({"weight": 1001})).await;
    a.assert_error(400, "from 1 to 1000");
    let a = c.post(&path, serde_json::json!({"weight": 3})).await;
    assert_eq!(a.json["weight"], 3, "{}", a.text);
    assert_eq!(a.json["before"], 1, "{}", a.text);

    let now = redis_now_ms(&mut redis).await;
    for t in ["a", "b"] {
        zadd_tenant(&mut redis, &b.key, t, &members(t, 4000, now, 0)).await;
    }
    // The share of `a` among `n` deliveries after `from` (epoch ms).
    let share_of_a = |from: i64, n: usize| {
        let got: Vec<Received> = inbox
            .all()
            .into_iter()
            .filter(|r| r.at_ms > from)
            .take(n)
            .collect();
        (
            got.len(),
            got.iter().filter(|r| r.body.starts_with(b"a-")).count() as f64
                / got.len().max(1) as f64,
        )
    };
    let enough = |from: i64| {
        let inbox = inbox.clone();
        async move { inbox.all().iter().filter(|r| r.at_ms > from).count() >= 1000 }
    };
    assert!(
        eventually(Duration::from_secs(20), || enough(now + 300)).await,
        "too slow"
    );
    let (n, first) = share_of_a(now + 300, 1000);
    assert_eq!(n, 1000);

    tenants_cli(&c.setup.config, &b.name, &["--weight", "a=default"]);
    tenants_cli(&c.setup.config, &b.name, &["--weight", "b=3"]);
    let changed = redis_now_ms(&mut redis).await;
    let row = tenant_row(c.port, &b.name, "b").await;
    assert_eq!(row["weight"], 3, "{row}");
    assert_eq!(row["weight_set_at_run_time"], true, "{row}");
    assert!(
        eventually(Duration::from_secs(20), || enough(changed + 300)).await,
        "too slow"
    );
    let (n, second) = share_of_a(changed + 300, 1000);
    assert_eq!(n, 1000);
    eprintln!("share of a: {first:.3} at 3:1, {second:.3} at 1:3");
    assert!(
        (0.675..=0.825).contains(&first),
        "a's share at 3:1 was {first:.3}"
    );
    assert!(
        (0.175..=0.325).contains(&second),
        "a's share at 1:3 was {second:.3}"
    );
}

/// The value of `metric`'s series for `business` and `tenant` (or another
/// label, `label="value"`) in a `/metrics` text; `None` when absent.
fn series(text: &str, metric: &str, business: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| l.contains(&format!("business=\"{business}\"")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `/metrics` shows the ten tenants with the most pending members by name
/// and the rest added up as `other`, however many tenants there are, with
/// each one's due count, oldest overdue and pause, and the tenant counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_metrics_name_the_top_ten_by_pending_and_add_up_the_rest_as_other() {
    let (b, c, _, mut redis) = tenants_console("tenants_metrics").await;
    // t11 is paused with its 12 members overdue; t00..t10 have 1..11
    // members due in an hour.
    pause_tenant(&c, &b, "t11").await;
    let now = redis_now_ms(&mut redis).await;
    for i in 0..12usize {
        let t = format!("t{i:02}");
        let from = if i == 11 { now - 5000 } else { now + 3_600_000 };
        zadd_tenant(&mut redis, &b.key, &t, &members(&t, i + 1, from, 1)).await;
    }
    let text = call(c.port, "GET", "/metrics", None, None).await.text;
    let pending = |t: &str| {
        series(
            &text,
            "delayd_tenant_pending",
            &b.name,
            &format!("tenant=\"{t}\""),
        )
    };
    let named = text
        .lines()
        .filter(|l| {
            l.starts_with("delayd_tenant_pending{")
                && l.contains(&format!("business=\"{}\"", b.name))
        })
        .count();
    assert_eq!(named, 11, "ten tenants and other:\n{text}");
    for i in 2..12 {
        assert_eq!(
            pending(&format!("t{i:02}")),
            Some(i as f64 + 1.0),
            "t{i:02}:\n{text}"
        );
    }
    assert_eq!(pending("t00"), None, "t00 is in other");
    assert_eq!(pending("other"), Some(3.0), "t00 and t01 added up");
    let of_t11 = |m: &str| series(&text, m, &b.name, "tenant=\"t11\"");
    assert_eq!(of_t11("delayd_tenant_paused"), Some(1.0));
    assert_eq!(
        of_t11("delayd_tenant_released_per_second"),
        Some(0.0),
        "a paused tenant releases nothing"
    );
    assert_eq!(of_t11("delayd_tenant_due"), Some(12.0));
    assert!(
        of_t11("delayd_tenant_oldest_overdue_seconds").unwrap() >= 5.0,
        "{text}"
    );
    assert_eq!(
        series(&text, "delayd_tenant_due", &b.name, "tenant=\"t10\""),
        Some(0.0)
    );
    assert_eq!(
        series(&text, "delayd_tenants", &b.name, "state=\"pending\""),
        Some(12.0)
    );
    assert_eq!(
        series(&text, "delayd_tenants", &b.name, "state=\"paused\""),
        Some(1.0)
    );
}

/// `delayd inspect`, `/metrics` and the console's overview count the
/// tenants' sets beside `K`: pending, due now (a paused tenant's members
/// too), the oldest overdue, and what comes due within an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_metrics_and_the_overview_count_the_tenants_sets_beside_k() {
    let (b, c, _, mut redis) = tenants_console("tenants_stats").await;
    // acme paused with 3 members 5 s overdue, globex 2 due in 30 minutes,
    // and one member written to K directly, due in 2 hours.
    pause_tenant(&c, &b, "acme").await;
    let now = redis_now_ms(&mut redis).await;
    zadd_tenant(
        &mut redis,
        &b.key,
        "acme",
        &members("acme", 3, now - 5000, 1),
    )
    .await;
    zadd_tenant(
        &mut redis,
        &b.key,
        "globex",
        &members("globex", 2, now + 1_800_000, 1),
    )
    .await;
    query::<()>(&mut redis, "ZADD", (&b.key, now + 7_200_000, "in-k")).await;

    let (code, out, err) = delayd(&[
        "inspect",
        "--config",
        c.setup.config.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["pending"], 6, "{out}");
    assert_eq!(v[0]["due_now"], 3, "{out}");
    assert!(v[0]["oldest_overdue_ms"].as_i64().unwrap() >= 5000, "{out}");
    assert_eq!(v[0]["tenants_uncounted"], 0, "{out}");

    let text = call(c.port, "GET", "/metrics", None, None).await.text;
    assert_eq!(
        series(&text, "delayd_pending", &b.name, ""),
        Some(6.0),
        "{text}"
    );
    assert!(series(&text, "delayd_oldest_overdue_seconds", &b.name, "").unwrap() >= 5.0);
    assert_eq!(
        series(&text, "delayd_pending_due_within", &b.name, "window=\"1h\""),
        Some(5.0),
        "{text}"
    );

    // The overview is reused for a second: the one the start read is stale.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let o = api_get(c.port, "/api/v1/businesses").await;
    let row = &o.json["businesses"][0];
    assert_eq!(row["pending"], 6, "{}", o.text);
    assert_eq!(row["due_now"], 3, "{}", o.text);
    assert_eq!(row["due_within"]["1h"], 5, "{}", o.text);
    assert_eq!(row["tenants"], true, "{}", o.text);
    assert_eq!(row["tenants_uncounted"], 0, "{}", o.text);
}

/// Every member `delayd list` shows for `business`, following its cursor
/// over pages of 4, with `extra` arguments.
fn list_all(cfg: &str, business: &str, extra: &[&str]) -> Vec<String> {
    let (mut out, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let mut args = vec!["list", "-c", cfg, business, "--json", "--limit", "4"];
        args.extend_from_slice(extra);
        if let Some(c) = &cursor {
            args.extend_from_slice(&["--cursor", c]);
        }
        let (code, text, err) = delayd(&args);
        assert_eq!(code, 0, "delayd {args:?}: {err}");
        let page: serde_json::Value = serde_json::from_str(&text).unwrap();
        for t in page["tasks"].as_array().unwrap() {
            out.push(t["body"].as_str().unwrap().to_string());
        }
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

/// `delayd` with `args`, asserting its exit code; stdout and stderr.
fn run_code(args: &[&str], code: i32) -> String {
    let (got, out, err) = delayd(args);
    assert_eq!(got, code, "delayd {args:?}: {out}{err}");
    format!("{out}{err}")
}

/// `list`, `search --prefix` and the bulk actions see the tasks waiting in
/// the tenants' sets beside `K`'s, in due order across them, or one named
/// tenant's alone; a bulk move in a tenant's set to an earlier time lowers
/// its index entry, so the tasks are delivered then, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_search_and_bulk_reach_the_tenants_sets_or_one_named_tenant() {
    let (b, c, inbox, mut redis) = tenants_console("tenants_bulk").await;
    let cfg = c.setup.config.to_str().unwrap();
    let name = b.name.as_str();
    let hour = redis_now_ms(&mut redis).await + 3_600_000;
    let (a, bs) = (
        members("a", 5, hour, 1000),
        members("b", 5, hour + 500, 1000),
    );
    zadd_tenant(&mut redis, &b.key, "a", &a).await;
    zadd_tenant(&mut redis, &b.key, "b", &bs).await;
    query::<()>(&mut redis, "ZADD", (&b.key, hour + 10_000, "k-0")).await;

    let mut due_order: Vec<String> = (0..5)
        .flat_map(|i| [format!("a-{i}"), format!("b-{i}")])
        .collect();
    due_order.push("k-0".into());
    assert_eq!(
        list_all(cfg, name, &[]),
        due_order,
        "K and every tenant's set, in due order"
    );
    let only_b: Vec<String> = (0..5).map(|i| format!("b-{i}")).collect();
    assert_eq!(list_all(cfg, name, &["--tenant", "b"]), only_b);

    let found = run_code(&["search", "-c", cfg, name, "--prefix", "b-"], 0);
    assert_eq!(
        found.lines().filter(|l| l.contains("\tb-")).count(),
        5,
        "{found}"
    );
    let found = run_code(
        &["search", "-c", cfg, name, "--prefix", "b-", "--tenant", "a"],
        0,
    );
    assert!(
        !found.contains("b-"),
        "a search limited to tenant a found b's: {found}"
    );

    // The API takes the same tenant.
    let bulk_path = format!("/api/v1/businesses/{name}/bulk/cancel");
    let dry = |body: &'static str| call(c.port, "POST", &bulk_path, Some(ADMIN), Some(body));
    let all_b = dry(r#"{"prefix": "b-", "dry_run": true}"#).await;
    assert_eq!(all_b.json["count"], 5, "{}", all_b.text);
    let in_a = dry(r#"{"prefix": "b-", "dry_run": true, "tenant": "a"}"#).await;
    assert_eq!(in_a.json["count"], 0, "{}", in_a.text);
    let page = call(
        c.port,
        "GET",
        &format!("/api/v1/businesses/{name}/tasks?tenant=b&limit=50"),
        None,
        None,
    )
    .await;
    assert_eq!(
        page.json["tasks"].as_array().map(Vec::len),
        Some(5),
        "{}",
        page.text
    );

    let bulk = |action: &str, filter: &[&str], last: &[&str]| {
        let mut args = vec!["bulk", action, "-c", cfg, name];
        args.extend_from_slice(filter);
        args.extend_from_slice(last);
        run_code(&args, 0)
    };
    let out = bulk("cancel", &["--prefix", "a-"], &["--dry-run"]);
    assert!(out.starts_with("5 members"), "{out}");
    bulk("cancel", &["--prefix", "a-"], &["--confirm", "5"]);
    let left: i64 = query(&mut redis, "ZCARD", family(&b.key).tenant_set(b"a")).await;
    assert_eq!(left, 0, "tenant a's tasks were not cancelled");

    // Due before k-0: a move limited to tenant b leaves k-0 in K.
    let to = (hour + 20_000).to_string();
    let b_due = ["--tenant", "b", "--to", &to, "--in", "2s"];
    let move_b = |last: &[&str]| bulk("reschedule", &b_due, last);
    let out = move_b(&["--dry-run"]);
    assert!(out.starts_with("5 members"), "{out}");
    let moved_at = redis_now_ms(&mut redis).await;
    move_b(&["--confirm", "5"]);
    let want: HashSet<Vec<u8>> = bodies(&bs);
    wait_all(&inbox, &want, Duration::from_secs(15), &c.daemon).await;
    inbox.settle(Duration::from_millis(1000)).await;
    for r in inbox.assert_each_once(
        &want,
        "tenant b's tasks moved to 2 s from now, and nothing else",
    ) {
        assert!(
            r.at_ms >= moved_at + 1900,
            "delivered before its new due time"
        );
    }
    let k0: Option<f64> = query(&mut redis, "ZSCORE", (&b.key, "k-0")).await;
    assert_eq!(
        k0,
        Some((hour + 10_000) as f64),
        "a move limited to tenant b moved K's task"
    );

    run_code(
        &[
            "bulk",
            "purge",
            "-c",
            cfg,
            name,
            "--reason",
            "x",
            "--tenant",
            "b",
            "--dry-run",
        ],
        2,
    );
}

/// How many of `tenant`'s members left its set per second between 1 s and
/// 5 s after the first left, on Redis's clock: the release rate itself,
/// sampled every 20 ms with `TIME` and `ZCARD` in one transaction, free of
/// whatever the publish path and the consumer add after the release.
async fn released_per_second(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
    tenant: &str,
    total: i64,
) -> f64 {
    let set = family(key).tenant_set(tenant.as_bytes());
    let mut samples: Vec<(f64, i64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let ((secs, micros), left): ((i64, i64), i64) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .zcard(&set)
            .query_async(redis)
            .await
            .unwrap();
        let at = secs as f64 + micros as f64 / 1e6;
        samples.push((at, left));
        let started = samples.iter().find(|(_, n)| *n < total);
        if started.is_some_and(|(t0, _)| at >= t0 + 5.0) || left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = samples
        .iter()
        .find(|(_, n)| *n < total)
        .expect("no member was released")
        .0;
    let at = |t: f64| {
        *samples
            .iter()
            .find(|(s, _)| *s >= t)
            .expect("the drain ended before the window")
    };
    let ((a, na), (b, nb)) = (at(t0 + 1.0), at(t0 + 5.0));
    (na - nb) as f64 / (b - a)
}

/// The tests whose figures are rates or lateness take turns: each
/// measures its own load, not another test's drain beside it.
static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Members of the `free` tenant in [`drain_capped_and_free`].
const FREE: usize = 3000;

/// Writes 3,600 members of tenant `capped` and [`FREE`] of `free` into
/// `key`, all due at once; once each is delivered once, returns the
/// `capped` tenant's release rate ([`released_per_second`]) and its
/// released rate as `delayd tenants` showed it in the three seconds after
/// (their median), when `listed`
/// names the config and business, and the `free` tenant's drain, members
/// a second from due to its last arrival.
async fn drain_capped_and_free(
    redis: &mut redis::aio::MultiplexedConnection,
    inbox: &Inbox,
    (key, listed): (&str, Option<(&std::path::Path, &str)>),
    d: &Daemon,
) -> (Option<(f64, u64)>, f64) {
    // Due once every member is written, however slow the host.
    let due = redis_now_ms(redis).await + 1000;
    let capped = members("capped", 3600, due, 0);
    let free = members("free", FREE, due, 0);
    zadd_tenant(redis, key, "capped", &capped).await;
    zadd_tenant(redis, key, "free", &free).await;
    let mut held = None;
    if let Some((cfg, business)) = listed {
        let rate = released_per_second(&mut redis.clone(), key, "capped", 3600).await;
        // The listing counts one whole second, which a stall of a loaded
        // host can cut short: the median of three seconds.
        let mut shown: Vec<u64> = Vec::new();
        for _ in 0..3 {
            let list: serde_json::Value =
                serde_json::from_str(&tenants_cli(cfg, business, &["--json"])).unwrap();
            let row = find_row(&list["rows"], "tenant", "capped");
            shown.push(row.and_then(|r| r["released_per_s"].as_u64()).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        shown.sort_unstable();
        held = Some((rate, shown[1]));
    }
    let mut want = bodies(&capped);
    want.extend(bodies(&free));
    wait_all(inbox, &want, Duration::from_secs(30), d).await;
    let got = inbox.assert_each_once(&want, "a drain with a capped tenant");
    let free_last = last_arrival(&got, b"free-");
    (held, FREE as f64 * 1000.0 / (free_last - due).max(1) as f64)
}

/// A tenant's `max_rate` holds within 5 % with two delayd claiming one
/// key (the budget is in Redis), measured at release, and `delayd tenants`
/// shows that rate as the tenant's released rate; a tenant without one
/// drains beside it at least 0.8 times as fast as the same load drains on
/// a business where neither is capped, in the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_max_rate_holds_across_two_instances_shows_as_its_released_rate_and_leaves_others_unaffected(
) {
    let _turn = TIMING.lock().await;
    const RATE: f64 = 400.0;
    let b = BusinessSpec::with_extra(
        "tenants_rate",
        "tenants = true\ntenant_max_rate = { capped = 400 }",
    );
    let twin = BusinessSpec::with_extra("tenants_uncapped", "tenants = true");
    let s = Setup::new(&[&b, &twin]).await;
    let mut redis = s.redis.clone();
    let d1 = Daemon::start(&s.config);
    let _d2 = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Both drains at once: a stall of a loaded host (a build beside the
    // tests) slows both, where one after the other it halved the rate of
    // whichever drain it fell in (a drain of 3,000 takes 0.3 s).
    let listed = Some((s.config.as_path(), b.name.as_str()));
    let mut twin_redis = redis.clone();
    let ((held, free_rate), (_, twin_rate)) = tokio::join!(
        drain_capped_and_free(&mut redis, &s.inboxes[0], (&b.key, listed), &d1),
        drain_capped_and_free(&mut twin_redis, &s.inboxes[1], (&twin.key, None), &d1),
    );
    let (held, shown) = held.unwrap_or_default();
    assert!(
        (shown as f64 - RATE).abs() <= RATE * 0.1,
        "delayd tenants showed the capped tenant released at {shown}/s, not within 10% of {RATE}"
    );
    eprintln!("capped tenant released at {held:.1}/s of {RATE} (delayd tenants: {shown}/s); the free tenant drained at {free_rate:.0}/s, {twin_rate:.0}/s with no cap on either");
    assert!(
        (held - RATE).abs() <= RATE * 0.05,
        "the capped tenant was released at {held:.1}/s, not within 5% of {RATE}"
    );
    assert!(
        free_rate >= 0.8 * twin_rate,
        "the free tenant drained at {free_rate:.0}/s beside a capped one, {twin_rate:.0}/s beside an uncapped one"
    );
}

/// A `max_rate` set at run time (API) caps a tenant the config leaves
/// uncapped, measured at release, and shows in the listing as set at run
/// time; `--max-rate T=default` (CLI) lifts it again, and the rest of its
/// backlog drains at once. Values out of range are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_rate_set_at_run_time_holds_and_default_returns_the_tenant_to_the_configs() {
    let _turn = TIMING.lock().await;
    const RATE: f64 = 300.0;
    // The 5 s measured release about 1,500; the rest must still hold 900
    // once the listing and the CLI's reset are done, which a loaded host
    // once took 2.7 s for (682 left of 3,000). After the reset the rest
    // drains at once, so a larger backlog costs no time.
    const TOTAL: usize = 4500;
    let (b, c, inbox, mut redis) = tenants_console("tenants_rt_rate").await;
    let path = format!("/api/v1/businesses/{}/tenants/t/max_rate", b.name);
    for bad in [0, 10_000_001] {
        let a = c.post(&path, serde_json::json!({"max_rate": bad})).await;
        a.assert_error(400, "from 1 to 10000000");
    }
    let a = c.post(&path, serde_json::json!({"max_rate": 300})).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json["max_rate"], 300, "{}", a.text);
    assert_eq!(a.json["before"], serde_json::Value::Null, "{}", a.text);

    let now = redis_now_ms(&mut redis).await;
    let all = members("t", TOTAL, now + 300, 0);
    zadd_tenant(&mut redis, &b.key, "t", &all).await;
    let held = released_per_second(&mut redis, &b.key, "t", TOTAL as i64).await;
    let row = tenant_row(c.port, &b.name, "t").await;
    assert_eq!(row["max_rate"], 300, "{row}");
    assert_eq!(row["max_rate_set_at_run_time"], true, "{row}");

    let out = tenants_cli(&c.setup.config, &b.name, &["--max-rate", "t=default"]);
    assert!(out.contains("config max_rate again: none"), "{out}");
    let lifted = Instant::now();
    let set = family(&b.key).tenant_set(b"t");
    let mut left: i64 = redis::AsyncCommands::zcard(&mut redis, &set).await.unwrap();
    let left_at_lift = left;
    while left > 0 && lifted.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = redis::AsyncCommands::zcard(&mut redis, &set).await.unwrap();
    }
    let emptied = lifted.elapsed();
    let row = tenant_row(c.port, &b.name, "t").await;
    eprintln!("released at {held:.1}/s of {RATE}; after the reset {left_at_lift} left the set in {emptied:?}");
    assert!(
        (held - RATE).abs() <= RATE * 0.05,
        "the tenant was released at {held:.1}/s, not within 5% of its run-time max_rate {RATE}"
    );
    // At the run-time rate they would take left_at_lift / 300 s.
    assert!(
        left_at_lift >= 900 && emptied.as_secs_f64() < 0.6 * left_at_lift as f64 / RATE,
        "{left_at_lift} members took {emptied:?} to leave once the max_rate was reset"
    );
    assert!(row.is_null() || row["max_rate"].is_null(), "{row}");
    let want = bodies(&all);
    wait_all(&inbox, &want, Duration::from_secs(30), &c.daemon).await;
    inbox.assert_each_once(&want, "a tenant capped at run time, then not");
}

/// In id mode, a search by body text shows tasks waiting in their tenants'
/// sets as pending, with their due times, as it does one in `K`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_search_shows_tasks_in_their_tenants_sets_as_pending_with_their_due_times() {
    let b = BusinessSpec::with_extra("tenants_body", "tenants = true\nmember = \"id\"");
    let s = Setup::new(&[&b]).await;
    let cfg = s.config.to_str().unwrap();
    let needle = unique("needle");
    let at_ms = redis_now_ms(&mut s.redis.clone()).await + 3_600_000;
    let at = at_ms.to_string();
    let tasks = [
        ("in-acme", Some("acme")),
        ("in-globex", Some("globex")),
        ("in-k", None),
    ];
    for (id, tenant) in tasks {
        let mut args = vec!["schedule", "-c", cfg, &b.name, "--id", id, "--at-ms", &at];
        args.extend(tenant.map_or(vec![], |t| vec!["--tenant", t]));
        args.push(&needle);
        let (code, out, err) = delayd(&args);
        assert_eq!(code, 0, "{out}{err}");
    }
    let (code, out, err) = delayd(&["search", "-c", cfg, &b.name, "--body", &needle]);
    assert_eq!(code, 0, "{out}{err}");
    for (id, _) in tasks {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("\t{id}\t")))
            .unwrap_or_else(|| panic!("{id} not found: {out}"));
        assert!(
            line.starts_with(&at),
            "{id} is not shown due at {at}: {line}"
        );
    }
}

/// In id mode the periodic sweep deletes a body only when its id is in no
/// set delayd reads: a task waiting in its tenant's set keeps its body
/// across sweeps and is delivered, not made dead for "no body". (The sweep
/// looked in `K`, in flight and the dead set only: the standing nemesis
/// over a business with tenants, lease 5 s, found its tasks dead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_waiting_in_their_tenants_sets_keep_their_bodies_across_sweeps_and_are_delivered() {
    // A 1 s lease sweeps every second; the tasks wait 4 s.
    let (b, s, inbox, mut redis) =
        tenants_setup("tenants_swept", "member = \"id\"\nlease = \"1s\"").await;
    let d = Daemon::start(&s.config);
    let f = family(&b.key);
    let due = redis_now_ms(&mut redis).await + 4_000;
    let mut want = HashSet::new();
    for t in ["acme", "globex"] {
        // Bodies first, then the ids, as a producer writes them: no id is
        // ever there without its body.
        let mut ids = Vec::new();
        let mut p = redis::pipe();
        for i in 0..50 {
            let id = format!("{t}-{i}");
            let body = unique(&format!("body-{id}"));
            p.hset(&f.body, &id, &body).ignore();
            want.insert(body.into_bytes());
            ids.push((due as f64, id.into_bytes()));
        }
        let () = p.query_async(&mut redis).await.unwrap();
        zadd_tenant(&mut redis, &b.key, t, &ids).await;
    }
    wait_all(&inbox, &want, Duration::from_secs(20), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    inbox.assert_each_once(&want, "tasks in their tenants' sets across sweeps");
    let dead: u64 = zcard(&mut redis, &f.dead).await;
    assert_eq!(
        dead,
        0,
        "tasks made dead: {:?}",
        dead_reason(&mut redis, &b.key, b"acme-0").await
    );
}

/// Writes task `id` with `body` into `tenant`'s set, due at `due` ms, as an
/// id-mode producer does: the body first, then the id and the index entry.
async fn schedule_in_tenant(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
    tenant: &str,
    (id, body): (&str, &str),
    due: i64,
) {
    let () = redis::cmd("HSET")
        .arg(&family(key).body)
        .arg(id)
        .arg(body)
        .query_async(redis)
        .await
        .unwrap();
    zadd_tenant(redis, key, tenant, &[(due as f64, id.as_bytes().to_vec())]).await;
}

/// The members in flight, as text.
async fn in_flight(redis: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let got: Vec<Vec<u8>> = query(redis, "ZRANGE", (&family(key).inflight, 0, -1)).await;
    got.iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect()
}

/// In id mode, an id a producer schedules again in its tenant's set while
/// its previous copy is in flight (claimed and published, its confirm
/// still owed) keeps its new body, and the new copy is delivered: the
/// previous copy's ack looks for the id in the tenant's set it was claimed
/// from, not only in `K`. (It looked in `K` only: the new copy went dead
/// for "no body".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_scheduled_again_in_its_tenants_set_while_in_flight_keeps_its_new_body() {
    let b = BusinessSpec::with_extra("tenants_again", "tenants = true\nmember = \"id\"");
    let relay = Relay::to(&amqp_url()).await;
    let s = Setup::through(&relay, &[&b]).await;
    let (inbox, mut redis) = (s.inbox().clone(), s.redis.clone());
    let d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut redis).await;
    // One task through first, so delayd's channel is open before the hold.
    let warm = unique("warm");
    schedule_in_tenant(&mut redis, &b.key, "acme", ("warm", &warm), now).await;
    let mut want = HashSet::from([warm.clone().into_bytes()]);
    wait_all(&inbox, &want, Duration::from_secs(20), &d).await;

    relay.hold();
    let first = unique("first");
    let now = redis_now_ms(&mut redis).await;
    schedule_in_tenant(&mut redis, &b.key, "acme", ("task", &first), now).await;
    let mut r = redis.clone();
    let key = b.key.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let (mut r, key) = (r.clone(), key.clone());
            async move { in_flight(&mut r, &key).await == ["task"] }
        })
        .await,
        "the first copy was not claimed: {:?}",
        in_flight(&mut r, &b.key).await
    );
    // Scheduled again while its confirm is held.
    let second = unique("second");
    let due = redis_now_ms(&mut redis).await + 1_000;
    schedule_in_tenant(&mut redis, &b.key, "acme", ("task", &second), due).await;
    relay.release();

    want.extend([first.into_bytes(), second.into_bytes()]);
    wait_all(&inbox, &want, Duration::from_secs(20), &d).await;
    inbox.settle(Duration::from_millis(500)).await;
    inbox.assert_each_once(&want, "an id scheduled again while in flight");
    let dead: u64 = zcard(&mut redis, &family(&b.key).dead).await;
    assert_eq!(
        dead,
        0,
        "made dead: {:?}",
        dead_reason(&mut redis, &b.key, b"task").await
    );
}

/// With `tenant_window`, no tenant has more unconfirmed publishes than it
/// on an instance, and while one tenant is held at it the window stays
/// open to the others: with the broker's confirms held, the heavy tenant's
/// members in flight stop at 40 while the light tenants' are claimed too
/// (without it, the heavy tenant's backlog fills the scanner's window of
/// 100 and the light tenants wait for confirms). Released, every member is
/// delivered once.
/// `b` behind a relay with its daemon started and warmed (one member
/// delivered), then the relay holding the broker's confirms. Returns the
/// members wanted so far.
async fn warm_then_held(b: &BusinessSpec) -> (Relay, Setup, Daemon, HashSet<Vec<u8>>) {
    let relay = Relay::to(&amqp_url()).await;
    let mut s = Setup::through(&relay, &[b]).await;
    let d = Daemon::start(&s.config);
    let now = redis_now_ms(&mut s.redis).await;
    let warm = vec![(now as f64, unique("warm").into_bytes())];
    zadd_tenant(&mut s.redis, &b.key, "warm", &warm).await;
    let want = bodies(&warm);
    wait_all(s.inbox(), &want, Duration::from_secs(20), &d).await;
    relay.hold();
    (relay, s, d, want)
}

/// A business with tenants, its confirms held, behind a heavy backlog.
struct Held {
    b: BusinessSpec,
    relay: Relay,
    s: Setup,
    d: Daemon,
    /// Every member written so far.
    want: HashSet<Vec<u8>>,
    redis: redis::aio::MultiplexedConnection,
}

/// A business `name` with tenants and `extra`, warmed and then held (see
/// [`warm_then_held`]), with 500 members of tenant "heavy" due now.
async fn held_behind_heavy(name: &str, extra: &str) -> Held {
    let b = BusinessSpec::with_extra(name, format!("tenants = true\n{extra}"));
    let (relay, s, d, mut want) = warm_then_held(&b).await;
    let mut redis = s.redis.clone();
    let now = redis_now_ms(&mut redis).await;
    let heavy = members("heavy", 500, now, 0);
    zadd_tenant(&mut redis, &b.key, "heavy", &heavy).await;
    want.extend(bodies(&heavy));
    Held {
        b,
        relay,
        s,
        d,
        want,
        redis,
    }
}

/// Four light tenants `light0..3` of `key`, each with `each` members due
/// 300 ms from now, added to `want`.
async fn add_light(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
    each: usize,
    want: &mut HashSet<Vec<u8>>,
) {
    let now = redis_now_ms(redis).await;
    for i in 0..4 {
        let light = members(&format!("light{i}"), each, now + 300, 0);
        zadd_tenant(redis, key, &format!("light{i}"), &light).await;
        want.extend(bodies(&light));
    }
}

/// Asserts that `n` light tenants' members of `key` come to be in flight;
/// returns what is in flight then.
async fn assert_light_in_flight(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
    n: usize,
) -> Vec<String> {
    let all_light = in_flight_reach(redis, key, "light", n).await;
    let flight = in_flight(redis, key).await;
    assert!(
        all_light,
        "light tenants' members in flight: {} of {n} (heavy's: {})",
        in_flight_of(&flight, "light"),
        in_flight_of(&flight, "heavy")
    );
    flight
}

/// How many of the members in `flight` start with `prefix`.
fn in_flight_of(flight: &[String], prefix: &str) -> usize {
    flight.iter().filter(|m| m.starts_with(prefix)).count()
}

/// Whether `n` members of `key` starting with `prefix` are in flight
/// within 10 s.
async fn in_flight_reach(
    redis: &redis::aio::MultiplexedConnection,
    key: &str,
    prefix: &str,
    n: usize,
) -> bool {
    eventually(Duration::from_secs(10), || {
        let (mut r, key) = (redis.clone(), key.to_string());
        async move { in_flight_of(&in_flight(&mut r, &key).await, prefix) == n }
    })
    .await
}

/// Releases the confirms and checks that every member written is
/// delivered once and the business drained.
async fn release_and_drain(mut h: Held, what: &str) {
    h.relay.release();
    let inbox = h.s.inbox().clone();
    wait_all(&inbox, &h.want, Duration::from_secs(30), &h.d).await;
    inbox.settle(Duration::from_millis(500)).await;
    inbox.assert_each_once(&h.want, what);
    wait_drained(&mut h.redis, &h.b.key, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_window_caps_a_tenants_unconfirmed_publishes_and_leaves_the_rest_to_others() {
    let mut h = held_behind_heavy(
        "tenants_window",
        "tenant_window = 40\nscanners = 1\nwindow = 100\nbatch_size = 100",
    )
    .await;
    add_light(&mut h.redis, &h.b.key, 5, &mut h.want).await;
    assert_light_in_flight(&mut h.redis, &h.b.key, 20).await;
    // Held for a while longer: the heavy tenant stays at its window.
    for _ in 0..10 {
        let flight = in_flight(&mut h.redis, &h.b.key).await;
        assert_eq!(
            in_flight_of(&flight, "heavy"),
            40,
            "heavy's members in flight"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    release_and_drain(h, "a business with a tenant window").await;
}

/// The express scanner: with the broker's confirms held, the one scanner's
/// window fills with the heavy tenant's members and it can claim no more;
/// light tenants that fall due after that are claimed all the same, one
/// member each, by a scanner that leaves the heavy tenant alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_tenants_newly_due_are_claimed_while_the_scanners_window_is_full_of_a_backlog() {
    let mut h = held_behind_heavy(
        "tenants_express",
        "scanners = 1\nwindow = 50\nbatch_size = 50",
    )
    .await;
    assert!(
        in_flight_reach(&h.redis, &h.b.key, "heavy", 50).await,
        "the scanner's window never filled with heavy's members"
    );
    add_light(&mut h.redis, &h.b.key, 1, &mut h.want).await;
    let flight = assert_light_in_flight(&mut h.redis, &h.b.key, 4).await;
    assert_eq!(
        in_flight_of(&flight, "heavy"),
        50,
        "the express scanner took none of the heavy tenant's members"
    );
    release_and_drain(h, "a business with an express scanner").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_light_tenants_member_due_since_the_last_claim_goes_in_the_next_claim() {
    let key = unique("fairnext");
    let mut r = redis().await;
    let now = redis_now_ms(&mut r).await;
    zadd_tenant(
        &mut r,
        &key,
        "heavy",
        &members("heavy", 50, now - 10_000, 0),
    )
    .await;
    zadd_tenant(&mut r, &key, "light", &members("light", 1, now - 5_000, 0)).await;
    let store = delayd::store::Store::new(
        store_conn().await,
        family(&key),
        delayd::config::ScoreUnit::Millis,
    )
    .with_tenants(true);
    let fair = delayd::tenants::Fair::new(Default::default(), 1);
    let lease = Duration::from_secs(60);
    // A claim of one: the heavy tenant's oldest goes; the light tenant's
    // due member is reported, so the next claim names it with its count.
    let first = fair.claim(&store, 1, lease).await.unwrap();
    assert_eq!(first.members.len(), 1);
    // Its next member falls due after that report, before the next claim.
    let next = (Vec::from(&b"light-late"[..]), now - 1);
    zadd_tenant(&mut r, &key, "light", &[(next.1 as f64, next.0.clone())]).await;
    let second = fair.claim(&store, 10, lease).await.unwrap();
    let claimed: HashSet<&[u8]> = second.members.iter().map(|c| c.body()).collect();
    assert!(
        claimed.contains(&b"light-0"[..]) && claimed.contains(&next.0[..]),
        "both light members go in the claim; claimed {:?}",
        second
            .members
            .iter()
            .map(|c| String::from_utf8_lossy(c.body()).into_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(second.members.len(), 10, "the heavy tenant fills the rest");
    del_family(&mut r, &key).await;
    let f = family(&key);
    let sets = [f.tenant_set(b"heavy"), f.tenant_set(b"light")];
    del(
        &mut r,
        (&f.tenant_index(), &f.tenant_clock(), &sets[0], &sets[1]),
    )
    .await;
}

/// Calls of each command Redis has run since it started, but for the
/// `INFO` the test itself sends.
async fn commands_run(
    c: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_string(), calls))
        })
        .collect()
}

/// Redis's `used_memory` before and after `write`, in bytes.
async fn memory_of<F: std::future::Future<Output = ()>>(
    c: &mut redis::aio::MultiplexedConnection,
    write: F,
) -> u64 {
    let before = info_field(c, "memory", "used_memory:").await;
    write.await;
    info_field(c, "memory", "used_memory:").await - before
}

/// The memory `tenants` tenants of `per` members of `len` bytes, due from
/// `due`, take written into `plain` as one set and into `tenanted`'s
/// tenants' sets: (in `plain`, in the tenants' sets).
async fn member_memory(
    c: &mut redis::aio::MultiplexedConnection,
    plain: &str,
    tenanted: &str,
    due: f64,
    (tenants, per, len): (usize, usize, usize),
) -> (u64, u64) {
    let body = |t: usize, i: usize| format!("{t:04}-{i:04}-{:0w$}", 0, w = len - 10).into_bytes();
    let all: Vec<(f64, Vec<u8>)> = (0..tenants)
        .flat_map(|t| (0..per).map(move |i| (due + i as f64, body(t, i))))
        .collect();
    let mut w = c.clone();
    let in_k = memory_of(c, zadd_many(&mut w, plain, &all)).await;
    let mut w = c.clone();
    let in_tenants = memory_of(c, async {
        for (t, chunk) in all.chunks(per).enumerate() {
            zadd_tenant(&mut w, tenanted, &format!("t{t}"), chunk).await;
        }
    })
    .await;
    (in_k, in_tenants)
}

/// Commands one idle daemon over `b` causes in `secs` seconds, after it
/// has settled in.
async fn idle_commands(
    dir: &std::path::Path,
    redis: &PrivateRedis,
    b: &BusinessSpec,
    secs: u64,
) -> std::collections::BTreeMap<String, u64> {
    std::fs::create_dir_all(dir).unwrap();
    let config = write_config(dir, &redis.url(), &amqp_url(), &[b]);
    let d = Daemon::start(&config);
    let mut c = redis_at(&redis.url()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = commands_run(&mut c).await;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let mut after = commands_run(&mut c).await;
    drop(d);
    for (name, calls) in before {
        *after.entry(name).or_default() -= calls;
    }
    after.retain(|_, n| *n > 0);
    after
}

/// A tenant held to its `max_rate` is claimed when its budget has room,
/// not at every wake-up: 200 writes a second into other tenants (members
/// due in an hour, each a new entry in the index, each a keyspace
/// notification) leave the claims near what the capped tenant's release
/// alone costs. The wake-up's look took the capped tenant's overdue head
/// for news and claimed at each write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_beside_a_tenant_held_at_its_max_rate_do_not_each_cause_a_claim() {
    let _turn = TIMING.lock().await;
    const WRITES: u64 = 200;
    const SECS: u64 = 4;
    let b = BusinessSpec::with_extra(
        "held_wakes",
        "tenants = true\ntenant_max_rate = { capped = 20 }",
    );
    let s = Setup::new(&[&b]).await;
    let mut c = s.redis.clone();
    let now = redis_now_ms(&mut c).await;
    let capped = members("capped", 200, now, 0);
    zadd_tenant(&mut c, &b.key, "capped", &capped).await;
    let text = std::fs::read_to_string(&s.config).unwrap();
    std::fs::write(
        &s.config,
        text.replace("listen = \"off\"", "listen = \"127.0.0.1:0\""),
    )
    .unwrap();
    let d = Daemon::start(&s.config);
    let port = d.metrics_port().await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let series = format!("delayd_claims_total{{business=\"{}\"}}", b.name);
    let before = metric(port, &series)
        .await
        .expect("delayd_claims_total is served");
    for i in 0..WRITES * SECS {
        let tenant = format!("later{i}");
        zadd_tenant(
            &mut c,
            &b.key,
            &tenant,
            &members(&tenant, 1, now + 3_600_000, 0),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1000 / WRITES)).await;
    }
    let claims = metric(port, &series)
        .await
        .expect("delayd_claims_total is served")
        - before;
    let released = s.inboxes[0].len();
    eprintln!(
        "{claims} claims while {} writes went beside a tenant capped at 20/s ({released} delivered so far)",
        WRITES * SECS
    );
    // Its release takes a claim and an empty one after it per budget
    // refill, 20 a second here (measured: 222 in 4 s); a claim per write
    // would be 800 more (measured before the fix: 1,058).
    assert!(
        claims <= 5 * 20 * SECS,
        "{claims} claims in {SECS} s beside a tenant capped at 20/s: the writes caused claims"
    );
    assert!(released > 0, "the capped tenant released nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_sets_cost_the_memory_of_one_set_within_10_percent_and_idle_no_command_per_tenant()
{
    let dir = tempfile::tempdir().unwrap();
    let redis = PrivateRedis::started(dir.path());
    let plain = BusinessSpec::with_extra("cost_plain", "");
    let tenanted = BusinessSpec::with_extra("cost_tenants", "tenants = true");
    let one = BusinessSpec::with_extra("cost_one_tenant", "tenants = true");
    let _consumers = Setup::on(&redis.url(), &amqp_url(), &[&plain, &tenanted, &one]).await;
    let mut c = redis_at(&redis.url()).await;
    // 20,000 members due in an hour, in `K` and spread over tenants'
    // sets: 1,000 tenants of 20 members of 64 bytes (Redis keeps sets this
    // small in its compact encoding), 200 tenants of 100 members of 200
    // bytes (as a skip list, each set with its own fixed cost), and, not
    // bound, 1,000 tenants of 20 members of 200 bytes.
    let due = redis_now_ms(&mut c).await as f64 + 3_600_000.0;
    // The first shape goes into the two businesses' own keys, for the idle
    // daemons below.
    let keys = [
        (plain.key.clone(), tenanted.key.clone()),
        (unique("test:plain_cost"), unique("test:tenants_cost")),
        (unique("test:plain_cost"), unique("test:tenants_cost")),
    ];
    let shapes = [(1000, 20, 64), (200, 100, 200), (1000, 20, 200)];
    for ((k, t), (tenants, per, len)) in keys.iter().zip(shapes) {
        let (in_k, in_tenants) = member_memory(&mut c, k, t, due, (tenants, per, len)).await;
        let per_member = |bytes: u64| bytes as f64 / (tenants * per) as f64;
        eprintln!(
            "{tenants} tenants x {per} members of {len} bytes: {:.1} bytes a member in K, {:.1} in the tenants' sets",
            per_member(in_k),
            per_member(in_tenants)
        );
        if (tenants, per, len) == (1000, 20, 200) {
            // Outside the bound, printed for docs/tenants.md: 1,000 sets too
            // large for the compact encoding and too small to amortise a
            // skip list's fixed cost.
            continue;
        }
        assert!(
            in_tenants as f64 <= in_k as f64 * 1.10,
            "{tenants} tenants x {per} members of {len} bytes took {in_tenants} bytes in the tenants' sets and {in_k} in K"
        );
    }
    zadd_tenant(&mut c, &one.key, "t0", &[(due, b"only".to_vec())]).await;
    // Idle: nothing is due for an hour. A command per tenant per second
    // would be 1,000 a second. The business with 1,000 tenants makes the
    // round trips of one without (a claim script per watchdog interval),
    // and its claim's commands inside Redis do not grow with its tenants.
    let secs = 10;
    let dir = dir.path();
    let without = idle_commands(&dir.join("plain"), &redis, &plain, secs).await;
    let with = idle_commands(&dir.join("tenants"), &redis, &tenanted, secs).await;
    let with_one = idle_commands(&dir.join("one"), &redis, &one, secs).await;
    let total = |m: &std::collections::BTreeMap<String, u64>| m.values().sum::<u64>();
    let calls =
        |m: &std::collections::BTreeMap<String, u64>| m.get("evalsha").copied().unwrap_or(0);
    eprintln!(
        "idle for {secs} s, Redis commands (those scripts run included): {} without tenants {without:?}, {} with 1,000 {with:?}, {} with 1 {with_one:?}",
        total(&without),
        total(&with),
        total(&with_one)
    );
    assert!(
        calls(&with) <= calls(&without) + 1,
        "idle for {secs} s, a business with 1,000 tenants called {} scripts and one without {}",
        calls(&with),
        calls(&without)
    );
    assert!(
        total(&with) as f64 <= total(&with_one) as f64 * 1.10 + 1.0,
        "idle for {secs} s, a business with 1,000 tenants ran {with:?} and one with 1 tenant {with_one:?}"
    );
}

/// A tenant name `delayd tenants` refuses is quoted in one short line:
/// a control character escaped, never written to the terminal, and a long
/// name cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tenant_name_is_quoted_escaped_and_cut_in_one_line() {
    let (b, s, _inbox, _redis) = tenants_setup("tenants_refused", "").await;
    let cfg = s.config.to_str().unwrap();
    let hostile = "a\u{1b}[2Jb";
    let out = run_code(&["tenants", "-c", cfg, &b.name, "--pause", hostile], 2);
    assert!(
        !out.contains('\u{1b}') && out.contains("a\\u{1b}[2Jb"),
        "the refusal: {out:?}"
    );
    let long = "x".repeat(3000);
    let out = run_code(&["tenants", "-c", cfg, &b.name, "--resume", &long], 2);
    assert!(
        out.lines().count() == 1 && out.len() < 300 && out.contains('…'),
        "the refusal of a 3,000-byte name: {} bytes, {:?}",
        out.len(),
        &out[..out.len().min(300)]
    );
}
