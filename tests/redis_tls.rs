//! delayd over TLS to Redis (`rediss://`), against Debian's redis-server
//! with certificates made by `deploy/local/certs.sh`: a drain exactly once,
//! a client certificate, and one clear line for each way the handshake can
//! fail (wrong CA, expired certificate, missing client certificate, a
//! clear-text server), from `delayd check` and from the daemon's `/readyz`.

use delayd_test_support as common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

/// The servers every test here shares, started once for the test binary.
struct Servers {
    certs: PathBuf,
    /// TLS, server certificate only.
    tls: u16,
    /// TLS, client certificates required.
    mtls: u16,
    /// TLS with an expired server certificate.
    expired: u16,
    /// Clear text.
    plain: u16,
}

static SERVERS: OnceLock<Servers> = OnceLock::new();

// Never waited for: it runs for the whole test binary and the watcher of
// `reap_with_this_process` ends it.
#[allow(clippy::zombie_processes)]
fn spawn_redis(dir: &std::path::Path, name: &str, args: &[String]) -> u32 {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new("redis-server")
        .args(args)
        .args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--notify-keyspace-events",
            "Kz",
        ])
        .env("DELAYD_TEST_REDIS_NODE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("cannot start redis-server");
    child.id()
}

fn servers() -> &'static Servers {
    SERVERS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let certs = common::certs().to_path_buf();
        let c = |f: &str| certs.join(f).display().to_string();
        let tls_args = |port: u16, cert: &str, key: &str, auth: &str| -> Vec<String> {
            vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                c(cert),
                "--tls-key-file".into(),
                c(key),
                "--tls-ca-cert-file".into(),
                c("ca.crt"),
                "--tls-auth-clients".into(),
                auth.into(),
            ]
        };
        let s = Servers {
            tls: free_port(13000..14000, &[]),
            mtls: free_port(13000..14000, &[]),
            expired: free_port(13000..14000, &[]),
            plain: free_port(13000..14000, &[]),
            certs: certs.clone(),
        };
        let pids = vec![
            spawn_redis(
                &dir,
                "tls",
                &tls_args(s.tls, "server.crt", "server.key", "no"),
            ),
            spawn_redis(
                &dir,
                "mtls",
                &tls_args(s.mtls, "server.crt", "server.key", "yes"),
            ),
            spawn_redis(
                &dir,
                "expired",
                &tls_args(s.expired, "expired.crt", "expired.key", "no"),
            ),
            spawn_redis(&dir, "plain", &["--port".into(), s.plain.to_string()]),
        ];
        reap_with_this_process(&pids);
        let start = Instant::now();
        for p in [s.tls, s.mtls, s.expired, s.plain] {
            while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "redis-server on {p} did not listen within 20s"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s
    })
}

fn cert(name: &str) -> String {
    servers().certs.join(name).display().to_string()
}

fn section(port: u16, extra: &str) -> String {
    format!("[redis]\nurl = \"rediss://127.0.0.1:{port}/0\"\n{extra}\n")
}

/// A connection made by delayd's own connection code from `config`.
async fn conn_for(config: &std::path::Path) -> delayd::redis_conn::RedisConn {
    let cfg = delayd::config::load(config).unwrap();
    delayd::redis_conn::Redis::new(&cfg.redis)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn drain_over(redis_section: &str, n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("tls");
    let amqp = amqp_at(&amqp_url()).await;
    let ch = amqp.create_channel().await.unwrap();
    let queue = unique("q");
    declare(&ch, &b.exchange, &queue, &b.routing_key).await;
    let inbox = consume(&amqp, &queue).await;
    let config = write_config_redis(dir.path(), redis_section, &amqp_url(), "off", &[&b]);
    let mut conn = conn_for(&config).await;
    let now = redis_now_ms(&mut conn).await;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| (now as f64, format!("m{i}").into_bytes()))
        .collect();
    zadd_many(&mut conn, &b.key, &items).await;
    let daemon = Daemon::start(&config);
    inbox.wait_for(n, Duration::from_secs(60)).await;
    wait_drained(&mut conn, &b.key, Duration::from_secs(30)).await;
    inbox.settle(Duration::from_millis(500)).await;
    let seen = counts(&inbox);
    assert_eq!(seen.len(), n, "log:\n{}", daemon.logs());
    assert!(seen.values().all(|c| *c == 1), "a member arrived twice");
    drop(daemon);
    assert_family_empty(&mut conn, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_over_tls_delivers_every_member_exactly_once() {
    let s = servers();
    drain_over(
        &section(s.tls, &format!("tls_ca_file = \"{}\"", cert("ca.crt"))),
        2000,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_is_presented_where_the_server_requires_one() {
    let s = servers();
    drain_over(
        &section(
            s.mtls,
            &format!(
                "tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
                cert("ca.crt"),
                cert("client.crt"),
                cert("client.key")
            ),
        ),
        200,
    )
    .await;
}

/// `delayd check` on a config with `redis_section`: its exit code and the
/// `redis` line of its output.
fn check(redis_section: &str) -> (i32, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("tlscheck");
    let config = write_config_redis(dir.path(), redis_section, &amqp_url(), "off", &[&b]);
    let start = Instant::now();
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    let took = start.elapsed();
    assert!(!err.contains("panicked"), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("redis "))
        .unwrap_or_else(|| panic!("no redis line in:\n{out}\n{err}"))
        .to_string();
    (code, line, took)
}

/// Asserts that `delayd check` against the server on `port`, trusting the
/// CA in `ca`, fails with one `redis` line naming the server and `why`;
/// returns how long it took.
fn check_fails_on(port: u16, ca: &str, why: &str) -> Duration {
    let (code, line, took) = check(&section(port, &format!("tls_ca_file = \"{}\"", cert(ca))));
    assert_eq!(code, 1, "{line}");
    let server = format!("127.0.0.1:{port}");
    assert!(line.contains(&server) && line.contains(why), "{line}");
    took
}

#[test]
fn wrong_ca_fails_check_with_one_clear_line() {
    check_fails_on(
        servers().tls,
        "other-ca.crt",
        "not signed by a CA delayd trusts",
    );
}

#[test]
fn expired_server_certificate_fails_check_with_one_clear_line() {
    check_fails_on(servers().expired, "ca.crt", "has expired");
}

#[test]
fn missing_client_certificate_fails_check_with_one_clear_line() {
    check_fails_on(servers().mtls, "ca.crt", "requires a client certificate");
}

#[test]
fn clear_text_server_behind_rediss_fails_check_within_seconds() {
    let took = check_fails_on(servers().plain, "ca.crt", "not speak TLS");
    assert!(took < Duration::from_secs(10), "check took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_keeps_retrying_and_readyz_says_why() {
    let s = servers();
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("tlsready");
    let http = free_port(13000..14000, &[]);
    let config = write_config_redis(
        dir.path(),
        &section(
            s.tls,
            &format!("tls_ca_file = \"{}\"", cert("other-ca.crt")),
        ),
        &amqp_url(),
        &format!("127.0.0.1:{http}"),
        &[&b],
    );
    let mut daemon = Daemon::start(&config);
    let mut body = String::new();
    let ok = eventually(Duration::from_secs(20), || {
        let got = http_get(http, "/readyz");
        if let Some((code, text)) = &got {
            body = format!("{code} {text}");
        }
        let done = got.is_some_and(|(_, g)| g.contains("not signed by a CA"));
        async move { done }
    })
    .await;
    assert!(
        ok,
        "readyz never named the reason; last:\n{body}\nlog:\n{}",
        daemon.logs()
    );
    assert!(body.starts_with("503 "), "{body}");
    // Still retrying a few seconds later, having said so once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "delayd exited");
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("connection lost or refused").count(),
        1,
        "the outage should be logged once:\n{logs}"
    );
    assert!(!logs.contains("panicked"), "{logs}");
    daemon.signal(15);
    assert!(daemon.wait(Duration::from_secs(10)).success());
}
