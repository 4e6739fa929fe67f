//! Recurring schedules against real servers: any number of instances
//! deliver each occurrence once; occurrences missed while every instance
//! was down follow `catch_up`; a schedule removed or changed takes back its
//! future occurrences; bad expressions and zones are refused at load.

use delayd_test_support as common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// A business with one schedule `tick`, every second, written `write_ahead`
/// ahead; `more` adds lines to the schedule.
fn every_second(more: &str) -> BusinessSpec {
    every_second_with("full", more)
}

/// Like [`every_second`], with the business's `properties` set to `properties`.
fn every_second_with(properties: &str, more: &str) -> BusinessSpec {
    let mut b = BusinessSpec::random("rec");
    b.extra = format!(
        "properties = \"{properties}\"\n[businesses.{}.recurring.tick]\ncron = \"* * * * * *\"\nbody = \"tick\"\n{more}\n",
        b.name
    );
    b
}

/// Each delivered occurrence's due time (ms), with how many times it came.
fn delivered(inbox: &Inbox) -> HashMap<i64, usize> {
    let mut out = HashMap::new();
    for r in inbox.all() {
        *out.entry(r.due()).or_insert(0) += 1;
    }
    out
}

/// Due times missing from the every-second run between the first and the
/// last delivered.
fn gaps(seen: &HashMap<i64, usize>) -> Vec<i64> {
    let min = *seen.keys().min().unwrap();
    let max = *seen.keys().max().unwrap();
    (0..=(max - min) / 1000)
        .map(|i| min + i * 1000)
        .filter(|t| !seen.contains_key(t))
        .collect()
}

fn stop_all(daemons: &mut [Daemon]) {
    for d in daemons.iter() {
        d.signal(15);
    }
    for d in daemons.iter_mut() {
        assert!(d.wait(Duration::from_secs(15)).success(), "{}", d.tail());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_deliver_each_every_second_occurrence_exactly_once() {
    let b = every_second("write_ahead = \"5s\"");
    let mut s = Setup::new(&[&b]).await;
    let mut daemons: Vec<Daemon> = (0..3).map(|_| Daemon::start(&s.config)).collect();
    tokio::time::sleep(Duration::from_secs(7)).await;
    stop_all(&mut daemons);
    s.inbox().settle(Duration::from_millis(1500)).await;
    let seen = delivered(s.inbox());
    assert!(seen.len() >= 4, "only {} occurrences in 7 s", seen.len());
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert_eq!(gaps(&seen), Vec::<i64>::new(), "an occurrence was skipped");
    for t in seen.keys() {
        assert_eq!(t % 1000, 0, "occurrences fall on whole seconds");
    }
    del_family(&mut s.redis, &b.key).await;
}

/// All instances killed with SIGKILL for about six occurrences, then one
/// started again: `catch_up` decides what the outage costs.
async fn outage(policy: &str) -> (HashMap<i64, usize>, String, i64) {
    let b = every_second(&format!("write_ahead = \"1s\"\ncatch_up = \"{policy}\""));
    let mut s = Setup::new(&[&b]).await;
    let mut daemons: Vec<Daemon> = (0..2).map(|_| Daemon::start(&s.config)).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for d in daemons.iter_mut() {
        d.kill();
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restart = wall_ms();
    let mut d = Daemon::start(&s.config);
    tokio::time::sleep(Duration::from_secs(3)).await;
    d.signal(15);
    assert!(d.wait(Duration::from_secs(15)).success(), "{}", d.tail());
    s.inbox().settle(Duration::from_millis(1000)).await;
    let seen = delivered(s.inbox());
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{policy}: delivered more than once: {twice:?}"
    );
    let logs = d.logs();
    del_family(&mut s.redis, &b.key).await;
    (seen, logs, restart)
}

/// The `missed=N` the restarted daemon logged, 0 when it logged none.
/// Asserts the outage missed occurrences and the log counts every one;
/// returns the ones missed.
fn assert_missed_and_counted(seen: &HashMap<i64, usize>, logs: &str) -> Vec<i64> {
    let missing = gaps(seen);
    assert!(!missing.is_empty(), "nothing was missed in a 6 s outage");
    assert_eq!(missed_in(logs), missing.len(), "{logs}");
    missing
}

fn missed_in(logs: &str) -> usize {
    logs.lines()
        .filter_map(|l| l.split("missed=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_all_instances_are_killed_catch_up_all_delivers_every_missed_occurrence() {
    let (seen, logs, _) = outage("all").await;
    assert_eq!(
        gaps(&seen),
        Vec::<i64>::new(),
        "catch_up = all skipped some"
    );
    assert_eq!(missed_in(&logs), 0, "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_all_instances_are_killed_catch_up_none_skips_and_counts_the_missed() {
    let (seen, logs, _) = outage("none").await;
    assert_missed_and_counted(&seen, &logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_all_instances_are_killed_catch_up_last_delivers_only_the_latest_missed() {
    let (seen, logs, restart) = outage("last").await;
    let missing = assert_missed_and_counted(&seen, &logs);
    // The latest missed one comes after the restart, more than the 2 s
    // grace late; every older one stays missed.
    let caught: Vec<i64> = seen
        .keys()
        .copied()
        .filter(|t| *t < restart - 2000 && *t > *missing.first().unwrap())
        .collect();
    assert_eq!(caught.len(), 1, "missing {missing:?}, caught {caught:?}");
    assert!(
        missing.iter().all(|m| m < &caught[0]),
        "{missing:?} {caught:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_schedule_and_a_changed_one_take_back_their_future_occurrences() {
    let mut b = BusinessSpec::random("rec");
    let head = "properties = \"full\"\n";
    let keep = |cron: &str| {
        format!("[businesses.{0}.recurring.keep]\ncron = \"{cron}\"\nbody = \"k\"\nwrite_ahead = \"30s\"\n", b.name)
    };
    let drop = format!(
        "[businesses.{0}.recurring.drop]\ncron = \"* * * * * *\"\nbody = \"d\"\nwrite_ahead = \"30s\"\n",
        b.name
    );
    b.extra = format!("{head}{}{drop}", keep("*/2 * * * * *"));
    let mut s = Setup::new(&[&b]).await;
    let mut d = Daemon::start(&s.config);
    let members = |mut r: redis::aio::MultiplexedConnection, key: String| async move {
        let v: Vec<(String, f64)> = query(&mut r, "ZRANGE", (&key, 0, -1, "WITHSCORES")).await;
        v
    };
    let ok = eventually(Duration::from_secs(10), || {
        let (r, k) = (s.redis.clone(), b.key.clone());
        async move {
            members(r, k)
                .await
                .iter()
                .filter(|(m, _)| m.starts_with("drop@"))
                .count()
                > 20
        }
    })
    .await;
    assert!(ok, "occurrences not written ahead:\n{}", d.tail());
    d.signal(15);
    assert!(d.wait(Duration::from_secs(15)).success());
    // The new config: `drop` gone, `keep` every 3 s.
    b.extra = format!("{head}{}", keep("*/3 * * * * *"));
    let config = write_config(s.dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let mut d = Daemon::start(&config);
    let ok = eventually(Duration::from_secs(10), || {
        let (r, k) = (s.redis.clone(), b.key.clone());
        async move {
            let now = wall_ms() as f64 + 1500.0;
            let future: Vec<(String, f64)> = members(r, k)
                .await
                .into_iter()
                .filter(|(_, sc)| *sc > now)
                .collect();
            !future.is_empty()
                && future
                    .iter()
                    .all(|(m, sc)| m.starts_with("keep@") && (*sc as i64 / 1000) % 3 == 0)
        }
    })
    .await;
    let now_members = members(s.redis.clone(), b.key.clone()).await;
    assert!(
        ok,
        "future occurrences not replaced: {now_members:?}\n{}",
        d.tail()
    );
    let logs = d.logs();
    assert!(logs.contains("schedule no longer configured"), "{logs}");
    assert!(logs.contains("schedule changed"), "{logs}");
    d.signal(15);
    assert!(d.wait(Duration::from_secs(15)).success());
    del_family(&mut s.redis, &b.key).await;
}

/// A config in `dir` with one business `rec` whose recurring schedules are
/// `schedules` (`$B` stands for the business's name).
fn with_schedules(dir: &std::path::Path, schedules: &str) -> (BusinessSpec, std::path::PathBuf) {
    let name = |b: &BusinessSpec| schedules.replace("$B", &b.name);
    let mut b = BusinessSpec::random("rec");
    b.extra = format!("properties = \"full\"\n{}", name(&b));
    let config = write_config(dir, &redis_url(), &amqp_url(), &[&b]);
    (b, config)
}

#[test]
fn bad_cron_expressions_and_zones_are_refused_at_load_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let schedules = "[businesses.$B.recurring.a]\ncron = \"61 * * * *\"\nbody = \"x\"\n[businesses.$B.recurring.b]\ncron = \"0 9 * * *\"\ntz = \"Mars/Olympus_Mons\"\nbody = \"x\"\n[businesses.$B.recurring.c]\ncron = \"0 0 30 2 *\"\nbody = \"x\"\n";
    let (_b, config) = with_schedules(dir.path(), schedules);
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for want in [
        "schedule \"a\", field \"cron\": \"61 * * * *\" is not a cron expression",
        "schedule \"b\", field \"tz\": \"Mars/Olympus_Mons\" is not an IANA time zone",
        "schedule \"c\", field \"cron\": \"0 0 30 2 *\" never matches",
    ] {
        assert!(err.contains(want), "{want:?} missing from {err}");
    }
    assert!(!err.contains("panicked"));
}

#[test]
fn delayd_recurring_lists_the_next_occurrences_as_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let schedules = "[businesses.$B.recurring.nightly]\ncron = \"30 2 * * *\"\ntz = \"Europe/Berlin\"\nbody = \"x\"\n";
    let (b, config) = with_schedules(dir.path(), schedules);
    let c = config.to_str().unwrap();
    let (code, out, err) = delayd(&[
        "recurring",
        "--config",
        c,
        &b.name,
        "--count",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let next = v[0]["next"].as_array().unwrap();
    assert_eq!(next.len(), 3);
    for n in next {
        let local = n["local"].as_str().unwrap();
        assert!(
            local.contains(" 02:30:00 ") || local.contains(" 03:00:00 "),
            "{local}"
        );
        let id = n["id"].as_str().unwrap();
        assert_eq!(id, format!("nightly@{}", n["due_ms"]));
    }
    let (code, out, _) = delayd(&["recurring", "--config", c, &b.name]);
    assert_eq!(code, 0);
    assert!(
        out.contains("nightly (30 2 * * * in Europe/Berlin"),
        "{out}"
    );
}

/// Like [`every_second`], with standard properties and the schedule's own
/// routing key, `tick.own`.
fn routed_tick(write_ahead: &str) -> BusinessSpec {
    let more = format!("routing_key = \"tick.own\"\nwrite_ahead = \"{write_ahead}\"");
    every_second_with("standard", &more)
}

/// A schedule's own routing key reaches the broker, with the occurrence's
/// stable message_id; the body is the schedule's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_with_its_own_routing_key_publishes_with_it() {
    let b = routed_tick("2s");
    let mut s = Setup::new(&[&b]).await;
    bind_key(&s.ch, &s.queues[0], &b.exchange, "tick.own").await;
    let mut d = Daemon::start(&s.config);
    s.inbox().wait_for(2, Duration::from_secs(10)).await;
    d.signal(15);
    assert!(d.wait(Duration::from_secs(15)).success());
    let got = s.inbox().all();
    assert!(got.len() >= 2, "{}", d.tail());
    for r in &got {
        assert_eq!(r.routing_key, "tick.own");
        assert_eq!(r.body, b"tick");
        assert!(r.message_id.is_some());
    }
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.message_id.clone()).collect();
    assert_eq!(ids.len(), got.len(), "one message_id per occurrence");
    del_family(&mut s.redis, &b.key).await;
}

/// The API shows a written-ahead occurrence of a schedule with its own
/// routing key as the command line does: its body and the message it will
/// be published as, not the stored envelope's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_shows_an_occurrence_with_its_own_routing_key_as_its_body_and_message() {
    let b = routed_tick("10s");
    let mut s = Setup::new(&[&b]).await;
    let port = listen_on_free_port(&s.config, 30000..32700);
    let d = Daemon::start(&s.config);
    let key = b.key.clone();
    let written = eventually_redis(&s.redis, Duration::from_secs(10), |mut c| {
        let key = key.clone();
        async move { zcard(&mut c, &key).await >= 5 }
    })
    .await;
    assert!(written, "no occurrences written ahead:\n{}", d.tail());
    let pending: Vec<String> = zrange(&mut s.redis, &b.key).await;
    let id = pending.last().unwrap();
    let got = api_get(port, &format!("/api/v1/businesses/{}/tasks/{id}", b.name)).await;
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["body"]["text"], "tick", "{}", got.text);
    assert_eq!(
        got.json["message"]["routing_key"], "tick.own",
        "{}",
        got.text
    );
    drop(d);
    del_family(&mut s.redis, &b.key).await;
}

/// `delayd recurring --pause` stops a schedule's deliveries and `--state`
/// shows it paused by the command line; `--run` delivers exactly one extra
/// occurrence meanwhile; `--resume` brings the schedule back; an unknown
/// schedule is one line naming the known ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_pauses_runs_once_and_resumes_a_schedule() {
    let b = every_second("write_ahead = \"3s\"");
    let mut s = Setup::new(&[&b]).await;
    let c = s.config.to_str().unwrap().to_string();
    let d = Daemon::start(&s.config);
    s.inbox().wait_for(2, Duration::from_secs(10)).await;
    let cli = |args: &[&str]| {
        let mut all = vec!["recurring", "--config", &c, &b.name];
        all.extend_from_slice(args);
        delayd(&all)
    };

    let (code, out, err) = cli(&["--pause", "tick"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("paused on every instance"), "{out}");
    let (code, out, _) = cli(&["--state", "--json"]);
    assert_eq!(code, 0);
    let state: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!state[0]["paused"].is_null(), "{out}");
    // What was claimed before the pause may still land; then nothing.
    s.inbox().settle(Duration::from_millis(1500)).await;
    let before = s.inbox().all().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(s.inbox().all().len(), before, "a paused schedule delivered");

    let (code, out, err) = cli(&["--run", "tick"]);
    assert_eq!(code, 0, "{out}{err}");
    s.inbox()
        .wait_for(before + 1, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_run = s.inbox().all();
    assert_eq!(after_run.len(), before + 1, "run now delivers exactly one");
    assert_eq!(after_run.last().unwrap().body, b"tick");

    let (code, out, err) = cli(&["--resume", "tick"]);
    assert_eq!(code, 0, "{out}{err}");
    s.inbox()
        .wait_for(before + 3, Duration::from_secs(10))
        .await;
    let (code, out, _) = cli(&["--state", "--json"]);
    assert_eq!(code, 0);
    let state: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(state[0]["paused"].is_null(), "{out}");

    let (code, _, err) = cli(&["--pause", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no schedule \"nope\"") && err.contains("tick"),
        "{err}"
    );
    drop(d);
    del_family(&mut s.redis, &b.key).await;
}
