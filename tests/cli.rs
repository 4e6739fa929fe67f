//! The command line as users and scripts see it: exit codes, one-line
//! errors that name the file, business and field, no panics, no secrets.

use delayd_test_support as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Servers nobody listens on: a config error must be reported before any
/// connection is tried, so these must never matter.
const NOWHERE: &str = "[redis]\nurl = \"redis://127.0.0.1:1/0\"\n[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"\n[http]\nlisten = \"off\"\n";

const BILLING: &str = "[businesses.billing]\nkey = \"delay:billing\"\nexchange = \"billing\"\nrouting_key = \"billing.due\"\n";

fn write(dir: &Path, body: &[u8]) -> PathBuf {
    let path = dir.join(format!("{}.toml", unique("bad")));
    std::fs::write(&path, body).unwrap();
    path
}

/// `delayd run --config path`; panics unless it exits within `limit`.
/// Returns (exit code, stderr, how long it took).
fn run_bounded(path: &Path, limit: Duration) -> (i32, String, Duration) {
    let start = Instant::now();
    let mut child = Command::new(daemon_bin())
        .args(["run", "--config"])
        .arg(path)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.code().unwrap_or(-1), err, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "delayd run --config {} still running after {limit:?}: it must refuse the file before connecting",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn bad_config_files_exit_2_at_once_with_one_line_naming_file_business_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let with = |extra: &str| format!("{NOWHERE}{BILLING}{extra}\n").into_bytes();
    let without = |field: &str| {
        let biz: String = BILLING
            .lines()
            .filter(|l| !l.starts_with(&format!("{field} =")))
            .map(|l| format!("{l}\n"))
            .collect();
        format!("{NOWHERE}{biz}").into_bytes()
    };
    // (what, file body, words the message must contain besides the path,
    // split at "|")
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("unknown field", with("batchsize = 5"), "billing|batchsize"),
        ("missing key", without("key"), "billing|\"key\"|required"),
        (
            "missing exchange",
            without("exchange"),
            "billing|\"exchange\"|required",
        ),
        (
            "missing routing_key",
            without("routing_key"),
            "billing|\"routing_key\"|required",
        ),
        (
            "batch_size = 0",
            with("batch_size = 0"),
            "billing|batch_size|0",
        ),
        ("scanners = 0", with("scanners = 0"), "billing|scanners|0"),
        (
            "negative batch_size",
            with("batch_size = -3"),
            "billing|batch_size|-3",
        ),
        (
            "unparseable duration",
            with("lease = \"thirty seconds\""),
            "billing|lease|thirty seconds",
        ),
        (
            "no businesses",
            NOWHERE.as_bytes().to_vec(),
            "no businesses",
        ),
        (
            "not TOML",
            b"this is {{ not toml ]] at all\n\x00\xff".to_vec(),
            "TOML",
        ),
    ];
    let mut paths: Vec<(String, PathBuf, &str)> = cases
        .into_iter()
        .map(|(what, body, words)| (what.to_string(), write(dir.path(), &body), words))
        .collect();
    let missing = dir.path().join("does-not-exist.toml");
    paths.push(("missing file".into(), missing, "cannot read"));

    for (what, path, words) in paths {
        let (code, err, took) = run_bounded(&path, Duration::from_secs(2));
        assert_eq!(code, 2, "{what}: exit code {code}, stderr: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            lines.len(),
            1,
            "{what}: stderr must be one line, got: {err}"
        );
        let line = lines[0];
        assert!(
            line.contains(&path.display().to_string()),
            "{what}: the message does not name the file: {line}"
        );
        for w in words.split('|') {
            assert!(line.contains(w), "{what}: the message lacks {w:?}: {line}");
        }
        for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
            assert!(!err.contains(bad), "{what}: {bad} in stderr: {err}");
        }
        eprintln!("{what}: exit 2 in {} ms: {line}", took.as_millis());
    }
}

/// A config for the shared test servers with one business, "billing", on
/// `exchange`, with the `extra` lines.
fn billing_config(dir: &Path, key: &str, exchange: &str, extra: &str) -> PathBuf {
    let b = BusinessSpec {
        name: "billing".into(),
        key: key.into(),
        exchange: exchange.into(),
        routing_key: unique("rk"),
        extra: extra.into(),
    };
    write_config(dir, &redis_url(), &amqp_url(), &[&b])
}

/// A config for the shared test servers with one business on `exchange`.
fn real_config(dir: &Path, key: &str, exchange: &str) -> PathBuf {
    billing_config(dir, key, exchange, "")
}

/// What a command's test acts on: "billing" on a fresh key, its exchange
/// never used, the config in a directory of its own, and a Redis connection.
struct Billing {
    _dir: tempfile::TempDir,
    key: String,
    /// The config's path, as a command's argument.
    cfg: String,
    r: redis::aio::MultiplexedConnection,
}

impl Billing {
    /// On a key named from `prefix`, with the `extra` config lines.
    async fn new(prefix: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = unique(prefix);
        let config = billing_config(dir.path(), &key, "unused", extra);
        Self {
            cfg: config.to_str().unwrap().to_string(),
            _dir: dir,
            key,
            r: redis().await,
        }
    }

    /// Like [`Billing::new`], in id mode.
    async fn id_mode(prefix: &str) -> Self {
        Self::new(prefix, "member = \"id\"\n").await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_against_the_real_servers_and_never_prints_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let exchange = unique("ex");
    let (_amqp, ch) = amqp_channel().await;
    declare(&ch, &exchange, &unique("q"), "rk").await;
    let config = real_config(dir.path(), &unique("test:check"), &exchange);
    assert!(
        amqp_url().contains(":guest@"),
        "this test expects the guest:guest URL of deploy/local/servers.sh"
    );
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "check failed:\n{out}\n{err}");
    assert!(out.contains("billing"), "{out}");
    for shown in [&out, &err] {
        assert!(!shown.contains(":guest@"), "password shown: {shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_exchange_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let exchange = unique("missing-ex");
    let config = real_config(dir.path(), &unique("test:check"), &exchange);
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_ne!(code, 0, "check passed with a missing exchange:\n{out}");
    assert!(
        out.contains(&exchange) || err.contains(&exchange),
        "the missing exchange is not named:\n{out}\n{err}"
    );
    assert!(!out.contains(":guest@") && !err.contains(":guest@"));
    assert!(
        !err.contains("delayd drained") && !err.contains('\r'),
        "no progress line off a terminal:\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_then_inspect_json_shows_it_pending() {
    let mut t = Billing::new("test:sched", "").await;
    let cfg = t.cfg.as_str();
    let (code, out, err) = delayd(&["schedule", "--config", cfg, "billing", "--in", "1s", "body"]);
    assert_eq!(code, 0, "schedule failed:\n{out}\n{err}");
    let (code, out, err) = delayd(&["inspect", "--config", cfg, "--json"]);
    assert_eq!(code, 0, "inspect failed:\n{out}\n{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).expect("inspect --json prints JSON");
    let row = find_row(&rows, "business", "billing")
        .unwrap_or_else(|| panic!("no row for billing: {out}"));
    assert_eq!(row["pending"], 1, "{out}");
    assert_eq!(row["in_flight"], 0, "{out}");
    assert_eq!(row["dead"], 0, "{out}");
    let members: Vec<Vec<u8>> = zrange(&mut t.r, &t.key).await;
    assert_eq!(members, vec![b"body".to_vec()]);
    del(&mut t.r, &t.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_with_redis_unreachable_exits_1_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("billing");
    // Everything else is fine, so Redis is the one thing to report.
    let (_amqp, ch) = amqp_channel().await;
    declare(&ch, &b.exchange, &unique("q"), &b.routing_key).await;
    let config = write_config(dir.path(), "redis://127.0.0.1:1/0", &amqp_url(), &[&b]);
    let f = assert_check_fails(&config);
    assert!(
        f.line.contains("redis://127.0.0.1:1/0") && f.line.contains("cannot reach Redis"),
        "the line should name Redis and its address: {}",
        f.line
    );
    assert!(!f.out.contains(":guest@") && !f.err.contains(":guest@"));
}

#[test]
fn dead_list_of_an_unknown_business_exits_2_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), format!("{NOWHERE}{BILLING}").as_bytes());
    let (code, out, err) = delayd(&["dead", "list", "--config", path.to_str().unwrap(), "nosuch"]);
    assert_eq!(code, 2, "exit code {code}:\n{out}\n{err}");
    assert!(err.contains("\"nosuch\""), "{err}");
    assert!(
        err.contains("billing"),
        "known businesses are listed: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_requeue_and_purge_count_first_then_act_on_one_member_or_a_reason() {
    let mut t = Billing::new("test:dead-cli", "").await;
    let cfg = t.cfg.as_str();
    seed_dead(
        &mut t.r,
        &t.key,
        &[
            ("a", "unroutable"),
            ("b", "unroutable"),
            ("c", "no body"),
            ("d", "too large"),
        ],
    )
    .await;
    let fam = family(&t.key);
    let run = |args: &[&str]| {
        let mut all = vec!["dead"];
        all.extend_from_slice(args);
        let (code, out, err) = delayd(&all);
        assert_eq!(code, 0, "delayd {all:?}:\n{out}\n{err}");
        out
    };

    let out = run(&[
        "requeue",
        "-c",
        cfg,
        "billing",
        "--reason",
        "unroutable",
        "--dry-run",
    ]);
    assert_eq!(
        out.trim(),
        "would requeue 2 dead members of business \"billing\", due now"
    );
    let out = run(&["purge", "-c", cfg, "billing", "--dry-run"]);
    assert_eq!(
        out.trim(),
        "would purge 4 dead members of business \"billing\""
    );
    assert_eq!(
        zcard(&mut t.r, &fam.dead).await,
        4,
        "a dry run changed nothing"
    );
    assert_eq!(zcard(&mut t.r, &t.key).await, 0);

    let out = run(&["requeue", "-c", cfg, "billing", "--reason", "unroutable"]);
    assert_eq!(
        out.trim(),
        "requeued 2 dead members of business \"billing\", due now"
    );
    let pending: Vec<String> = zrange(&mut t.r, &t.key).await;
    assert_eq!(pending, ["a", "b"]);
    let out = run(&["purge", "-c", cfg, "billing", "--member", "d"]);
    assert_eq!(out.trim(), "purged 1 dead members of business \"billing\"");
    let left: Vec<String> = zrange(&mut t.r, &fam.dead).await;
    assert_eq!(left, ["c"]);

    let (code, _, err) = delayd(&[
        "dead", "purge", "-c", cfg, "billing", "--member", "c", "--reason", "x",
    ]);
    assert_eq!(code, 2, "--member and --reason together are refused: {err}");
    del_family(&mut t.r, &t.key).await;
}

/// The temporary configs `delayd bench` writes (they hold the URLs).
fn bench_configs() -> std::collections::HashSet<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("delayd-bench-") && n.ends_with(".toml"))
        })
        .collect()
}

/// What a bench run named `tag` could leave behind: its keys, its queue,
/// and a daemon still running on its config.
async fn assert_bench_left_nothing(tag: &str, config: &Path) {
    let mut r = redis().await;
    let keys: Vec<String> = query(&mut r, "KEYS", format!("*delayd:bench:{tag}*")).await;
    assert!(keys.is_empty(), "bench left keys behind: {keys:?}");
    let (_amqp, ch) = amqp_channel().await;
    let queue = format!("delayd-bench-{tag}");
    let passive = ch
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await;
    assert!(passive.is_err(), "bench left its queue {queue} behind");
    assert!(!config.exists(), "bench left {} behind", config.display());
    let needle = config.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains(&needle),
            "a daemon on {needle} outlived the bench"
        );
    }
}

/// The bench's tag, from the name of the config it wrote.
fn tag_of(config: &Path) -> String {
    let name = config.file_stem().unwrap().to_string_lossy().into_owned();
    name.rsplit('-').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prints_its_table_with_servers_also_named_by_the_environment_and_cleans_up_also_when_terminated(
) {
    let dir = tempfile::tempdir().unwrap();
    let config = real_config(dir.path(), &unique("test:bench"), "unused");
    let config = config.to_str().unwrap();

    // A short complete run: every row of the table, exit 0, with the
    // servers named by the environment too (counted once, not twice).
    let before = bench_configs();
    let env = [
        ("DELAYD_AMQP__URL", amqp_url()),
        ("DELAYD_REDIS__URL", redis_url()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, out, err) = short_bench_with_env(config, &[], &env);
    assert_eq!(code, 0, "bench failed:\n{out}\n{err}");
    for row in [
        "raw confirmed publish (ceiling)",
        "raw publish, delayd's format",
        "delayd drain",
        "delayd / ceiling",
        "common recipe drain",
        "200 of 200 received",
        "idle Redis commands",
        "delayd RSS",
    ] {
        assert!(out.contains(row), "no {row:?} in:\n{out}");
    }
    assert!(!out.contains(":guest@") && !err.contains(":guest@"));

    // SIGTERM in the middle of a run: exit 1, and nothing left behind.
    let mut child = Command::new(daemon_bin())
        .args(["bench", "--config", config, "--messages", "1000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let written = poll_for(
        Duration::from_secs(30),
        "bench never started its daemon",
        || bench_configs().difference(&before).next().cloned(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = poll_for(Duration::from_secs(30), "bench ignored SIGTERM", || {
        child.try_wait().unwrap()
    });
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_bench_left_nothing(&tag_of(&written), &written).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_the_start_log_warn_of_an_allkeys_eviction_policy() {
    let dir = tempfile::tempdir().unwrap();
    let redis_server = PrivateRedis::started(dir.path());
    let mut conn = redis_at(&redis_server.url()).await;
    let _: () = query(
        &mut conn,
        "CONFIG",
        ("SET", "maxmemory-policy", "allkeys-lru"),
    )
    .await;
    let b = BusinessSpec::random("evict");
    let c = Consumers::on(&amqp_url(), &[&b]).await;
    let config = write_config(c.dir.path(), &redis_server.url(), &amqp_url(), &[&b]);
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "a warning, not a failure:\n{out}\n{err}");
    assert!(
        out.contains("WARNING: maxmemory-policy is \"allkeys-lru\""),
        "{out}"
    );
    let d = Daemon::start(&config);
    let warned = eventually(Duration::from_secs(10), || async {
        d.logs().contains("maxmemory-policy is \\\"allkeys-lru\\\"")
            || d.logs().contains("maxmemory-policy is \"allkeys-lru\"")
    })
    .await;
    assert!(warned, "{}", d.logs());
}

#[test]
fn a_list_cursor_with_text_that_is_not_hex_is_one_error_line_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), format!("{NOWHERE}{BILLING}").as_bytes());
    for cursor in ["1:aéb", "1:é", "1:0é"] {
        let (code, out, err) = delayd(&[
            "list",
            "--config",
            path.to_str().unwrap(),
            "billing",
            "--cursor",
            cursor,
        ]);
        assert_eq!(code, 2, "{cursor}: {out}{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--cursor"), "{err}");
    }
}

#[test]
fn time_flags_name_themselves_and_a_backward_range_an_empty_body_or_a_bad_new_time_is_refused_in_one_line(
) {
    let dir = tempfile::tempdir().unwrap();
    let conf = format!("{NOWHERE}{BILLING}member = \"id\"\n");
    let path = write(dir.path(), conf.as_bytes());
    let cfg = path.to_str().unwrap();
    // Each command line, split on spaces, with CFG for the file and '' for
    // an empty argument.
    let cases = [
        (
            "list -c CFG billing --from tomorrow",
            "--from \"tomorrow\": ",
        ),
        ("list -c CFG billing --to soon", "--to \"soon\": "),
        (
            "bulk cancel -c CFG billing --from soon --dry-run",
            "--from \"soon\": ",
        ),
        (
            "list -c CFG billing --from 2000 --to 1000",
            "--from (2000) is after --to (1000)",
        ),
        (
            "bulk cancel -c CFG billing --from 2000 --to 1000 --dry-run",
            "--from (2000) is after --to (1000)",
        ),
        (
            "search -c CFG billing --body ''",
            "--body must be 1 to 1024 bytes",
        ),
        (
            "bulk reschedule -c CFG billing --prefix a --in forever --dry-run",
            "--in \"forever\": ",
        ),
    ];
    for (line, want) in cases {
        let args: Vec<&str> = line
            .split(' ')
            .map(|a| match a {
                "CFG" => cfg,
                "''" => "",
                a => a,
            })
            .collect();
        // Redis is unreachable: each is refused before any connection.
        let (code, out, err) = delayd(&args);
        assert_eq!(code, 2, "{line}: {out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{line}: {err}");
        assert!(err.contains(want), "{line}: want {want:?} in {err}");
    }
}

#[test]
fn a_listing_piped_into_a_reader_that_goes_away_ends_quietly_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let conf = format!("{NOWHERE}{BILLING}shards = 64\n");
    let path = write(dir.path(), conf.as_bytes());
    // `delayd shards` needs no server: 64 lines into a pipe whose reader
    // is gone before it starts, as `delayd list | head -1` leaves it. (A
    // reader closed after the spawn raced the writer: 64 short lines fit
    // in the pipe's buffer, and a quick child exited 0 before the close.)
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(daemon_bin())
        .args(["shards", "--config", path.to_str().unwrap(), "billing"])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "nothing on stderr: {err}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "ended by the closed pipe, as Unix tools are: {:?}",
        out.status
    );
}

/// Audit entries of `business` whose `what` names `id`, newest first, as
/// (by, action, count).
async fn audit_of(
    r: &mut redis::aio::MultiplexedConnection,
    id: &str,
) -> Vec<(String, String, u64)> {
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg("delayd:audit")
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(500)
        .query_async(r)
        .await
        .unwrap();
    let get = |f: &[(String, String)], k: &str| {
        f.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    rows.into_iter()
        .filter(|(_, f)| get(f, "what").contains(id))
        .map(|(_, f)| {
            (
                get(&f, "by"),
                get(&f, "action"),
                get(&f, "count").parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_reschedule_and_cancel_from_the_cli_each_write_one_audit_entry_by_cli() {
    let mut t = Billing::id_mode("test:cli-audit").await;
    let cfg = t.cfg.as_str();
    let id = unique("task");
    let ok = |args: &[&str]| {
        let (code, out, err) = delayd(args);
        assert_eq!(code, 0, "delayd {args:?}:\n{out}\n{err}");
    };
    ok(&[
        "schedule", "-c", cfg, "billing", "--id", &id, "--in", "1h", "body",
    ]);
    ok(&["reschedule", "-c", cfg, "billing", &id, "--in", "2h"]);
    ok(&["cancel", "-c", cfg, "billing", &id]);
    let (code, _, _) = delayd(&["cancel", "-c", cfg, "billing", &id]);
    assert_eq!(code, 4, "a second cancel finds nothing pending");
    let entries = audit_of(&mut t.r, &id).await;
    let want: Vec<(String, String, u64)> = [
        ("cancel", 0),
        ("cancel", 1),
        ("reschedule", 1),
        ("schedule", 1),
    ]
    .iter()
    .map(|(a, n)| ("cli".to_string(), a.to_string(), *n))
    .collect();
    assert_eq!(
        entries, want,
        "newest first, each by cli with how many it changed"
    );
    del_family(&mut t.r, &t.key).await;
}

/// 1200 ids `{prefix}-N` due in an hour plus one `other`, each with a body;
/// the prefix that picks the 1200.
async fn seed_bulk(r: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let fam = family(key);
    let now = redis_now_ms(r).await;
    let prefix = unique("grp");
    let mut p = redis::pipe();
    for i in 0..1200 {
        let id = format!("{prefix}-{i}");
        p.zadd(key, &id, now + 3_600_000).ignore();
        p.hset(&fam.body, &id, format!("payload {i} for ACME"))
            .ignore();
    }
    p.zadd(key, "other", now + 3_600_000).ignore();
    let _: () = p.query_async(r).await.unwrap();
    format!("{prefix}-")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_from_the_cli_counts_first_acts_only_with_the_count_confirmed_and_audits_the_total(
) {
    let mut t = Billing::id_mode("test:cli-bulk").await;
    let cfg = t.cfg.as_str();
    let pick = seed_bulk(&mut t.r, &t.key).await;

    let (code, out, err) = delayd(&cancel_prefix(cfg, &pick, &["--dry-run"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("1200 members of business \"billing\""),
        "{out}"
    );
    let (code, _, err) = delayd(&cancel_prefix(cfg, &pick, &[]));
    assert_eq!(code, 2, "acting needs --confirm: {err}");
    assert!(err.contains("--confirm 1200"), "{err}");
    assert_eq!(
        zcard(&mut t.r, &t.key).await,
        1201,
        "nothing done without the count confirmed"
    );

    let (code, out, err) = delayd(&["search", "-c", cfg, "billing", "--body", "payload 7 for"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains(&format!("{pick}7\t")), "{out}");

    let (code, out, err) = delayd(&cancel_1200(cfg, &pick));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("bulk_cancel: 1200 members"), "{out}");
    // Off a terminal, the acting run prints its one line and no progress.
    assert_eq!(out.lines().count(), 1, "{out}");
    assert_eq!(err, "", "nothing on stderr off a terminal");
    assert_eq!(
        zcard(&mut t.r, &t.key).await,
        1,
        "only the other id is left"
    );
    let entries = audit_of(&mut t.r, &pick).await;
    assert_eq!(
        entries,
        [("cli".to_string(), "bulk_cancel".to_string(), 1200)]
    );
    del_family(&mut t.r, &t.key).await;
}

/// `delayd bulk cancel` of the ids under `pick`, then `more` arguments.
fn cancel_prefix<'a>(cfg: &'a str, pick: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["bulk", "cancel", "-c", cfg, "billing", "--prefix", pick];
    args.extend_from_slice(more);
    args
}

/// `delayd bulk cancel` of the 1,200 ids under `pick` that `seed_bulk` wrote.
fn cancel_1200<'a>(cfg: &'a str, pick: &'a str) -> Vec<&'a str> {
    cancel_prefix(cfg, pick, &["--confirm", "1200"])
}

/// Runs `delayd args` on a pseudo-terminal (util-linux `script`), stdin
/// empty, at most 60 s; (exit code, everything the terminal showed).
fn delayd_on_a_terminal(args: &[&str]) -> (i32, String) {
    let quoted: Vec<String> = std::iter::once(daemon_bin().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let mut child = Command::new("script")
        .args([
            "--quiet",
            "--return",
            "--command",
            &quoted.join(" "),
            "/dev/null",
        ])
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run script (util-linux)");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut shown = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut shown).unwrap();
        String::from_utf8_lossy(&shown).into_owned()
    });
    let status = poll_for(
        Duration::from_secs(60),
        "delayd on a terminal ran over 60 s",
        || child.try_wait().unwrap(),
    );
    (status.code().unwrap_or(-1), reader.join().unwrap())
}

/// On a terminal, `delayd bulk` shows a progress line with its count
/// towards the confirmed total, its rate and the time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_on_a_terminal_shows_progress_with_the_count_done_of_the_confirmed_total() {
    let mut t = Billing::id_mode("test:cli-bulk-tty").await;
    let cfg = t.cfg.as_str();
    let pick = seed_bulk(&mut t.r, &t.key).await;
    let (code, shown) = delayd_on_a_terminal(&cancel_1200(cfg, &pick));
    assert_eq!(code, 0, "{shown}");
    let line = shown
        .split(['\r', '\n'])
        .find(|l| l.contains("bulk_cancel \"billing\": 1,200/1,200"))
        .unwrap_or_else(|| panic!("no progress line with the count in:\n{shown:?}"));
    assert!(
        line.contains("/s") && line.contains("left"),
        "rate and time left: {line:?}"
    );
    assert!(shown.contains("bulk_cancel: 1200 members"), "{shown}");
    assert_eq!(
        zcard(&mut t.r, &t.key).await,
        1,
        "only the other id is left"
    );
    del_family(&mut t.r, &t.key).await;
}
