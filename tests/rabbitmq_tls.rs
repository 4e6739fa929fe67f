//! RabbitMQ over TLS: a private node with an SSL listener that verifies
//! clients (`verify_peer`, `fail_if_no_peer_cert`), started once for this
//! test binary with the certificates of `deploy/local/certs.sh`, and servers
//! that get TLS wrong in each way a user meets: an unknown CA, an expired
//! certificate, no client certificate, clear text, and no answer at all.

use delayd_test_support as common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

/// The TLS node: its clear-text AMQP port (for the tests' own consumers) and
/// its TLS port. Killed by its watcher once this test binary exits.
struct TlsNode {
    amqp: u16,
    tls: u16,
}

fn node() -> &'static TlsNode {
    static NODE: OnceLock<TlsNode> = OnceLock::new();
    NODE.get_or_init(|| {
        let certs = certs();
        let amqp = rabbit_port();
        let tls = free_port(16000..19000, &[]);
        let dir = std::env::temp_dir().join(format!("delayd-tls-node-{}", std::process::id()));
        run_script(
            "rabbitmq-node.sh",
            &["start", dir.to_str().unwrap(), &amqp.to_string()],
            &[
                ("DELAYD_RABBITMQ_DIST_PORT", (amqp - 10000).to_string()),
                ("DELAYD_RABBITMQ_TLS_PORT", tls.to_string()),
                ("DELAYD_RABBITMQ_TLS_CERTS", certs.display().to_string()),
                ("DELAYD_RABBITMQ_WATCH_PID", std::process::id().to_string()),
                ("DELAYD_START_TIMEOUT", "90".into()),
            ],
        );
        TlsNode { amqp, tls }
    })
}

fn clear_url(n: &TlsNode) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", n.amqp)
}

/// An `[amqp]` section: `url` plus the named files of the certificate directory.
fn amqp_section(url: &str, ca: Option<&str>, client: bool) -> String {
    let c = certs();
    let mut s = format!("url = \"{url}\"\nconnect_timeout = \"3s\"\n");
    if let Some(ca) = ca {
        s.push_str(&format!("tls_ca_file = \"{}\"\n", c.join(ca).display()));
    }
    if client {
        s.push_str(&format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            c.join("client.crt").display(),
            c.join("client.key").display()
        ));
    }
    s
}

/// `delayd check` against `[amqp]` as given: (exit code, stdout + stderr).
fn check(dir: &Path, amqp: &str) -> (i32, String) {
    let b = BusinessSpec::random("tls_check");
    let config = write_config_with(dir, &redis_url(), amqp, "off", &[&b]);
    let started = Instant::now();
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "check took {:?}, not failing fast: {out}{err}",
        started.elapsed()
    );
    (code, format!("{out}{err}"))
}

/// Starts delayd with `amqp_section` for a random business named after
/// `name`, its HTTP endpoint on a free port, which it returns.
fn start_listening(dir: &std::path::Path, amqp_section: &str, name: &str) -> (Daemon, u16) {
    let http = free_port(16000..19000, &[]);
    let b = BusinessSpec::random(name);
    let listen = format!("127.0.0.1:{http}");
    let config = write_config_with(dir, &redis_url(), amqp_section, &listen, &[&b]);
    (Daemon::start(&config), http)
}

/// The `amqp` line of `delayd check`'s report.
fn amqp_line(out: &str) -> String {
    out.lines()
        .filter(|l| l.starts_with("amqp"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Drains `n` members through delayd over `amqp` and asserts each arrived
/// exactly once, on a queue the test reads over clear text.
async fn drain_exactly_once(amqp_section: &str, n: usize) {
    let node = node();
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("tls_drain");
    let conn = amqp_at(&clear_url(node)).await;
    let ch = conn.create_channel().await.unwrap();
    let inbox = bind_and_consume(&conn, &ch, &b, &unique("q")).await;
    let mut redis = redis().await;
    let now = redis_now_ms(&mut redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| (now as f64, format!("tls-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &items).await;
    let config = write_config_with(dir.path(), &redis_url(), amqp_section, "off", &[&b]);
    let mut d = Daemon::start(&config);
    inbox.wait_for(n, Duration::from_secs(60)).await;
    wait_drained(&mut redis, &b.key, Duration::from_secs(30)).await;
    inbox.settle(Duration::from_millis(500)).await;
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
    for r in inbox.all() {
        *counts.entry(r.body).or_default() += 1;
    }
    assert_eq!(counts.len(), n, "distinct members delivered");
    assert!(
        counts.values().all(|&c| c == 1),
        "a member was delivered twice"
    );
    d.signal(15);
    assert!(d.wait(Duration::from_secs(20)).success(), "{}", d.logs());
    assert_family_empty(&mut redis, &b.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_over_amqps_exactly_once_with_a_private_ca_and_a_client_certificate() {
    let n = node();
    let url = format!("amqps://guest:guest@127.0.0.1:{}/%2f", n.tls);
    drain_exactly_once(&amqp_section(&url, Some("ca.crt"), true), 2000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_login_with_the_client_certificate_drains_exactly_once() {
    let n = node();
    // No user or password: RabbitMQ logs delayd in as the certificate's CN.
    let url = format!("amqps://127.0.0.1:{}/%2f?auth_mechanism=external", n.tls);
    drain_exactly_once(&amqp_section(&url, Some("ca.crt"), true), 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_fails_check_with_one_clear_line_and_readyz_says_why() {
    let n = node();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("amqps://guest:secret-pw@127.0.0.1:{}/%2f", n.tls);
    let section = amqp_section(&url, Some("other-ca.crt"), true);
    let (code, out) = check(dir.path(), &section);
    assert_eq!(code, 1, "{out}");
    let line = amqp_line(&out);
    assert_eq!(line.lines().count(), 1, "{out}");
    assert!(
        line.contains("not signed by a CA delayd trusts") && line.contains("tls_ca_file"),
        "{out}"
    );
    assert!(
        line.contains(&format!("guest:***@127.0.0.1:{}", n.tls)),
        "names the node: {out}"
    );
    assert!(!out.contains("secret-pw"), "password leaked: {out}");

    // The daemon keeps retrying and says why on /readyz.
    let (mut d, http) = start_listening(dir.path(), &section, "tls_readyz");
    let said = eventually(Duration::from_secs(20), || async {
        matches!(http_get(http, "/readyz"), Some((503, body)) if body.contains("amqp: down") && body.contains("not signed by a CA"))
    })
    .await;
    assert!(
        said,
        "/readyz: {:?}; log:\n{}",
        http_get(http, "/readyz"),
        d.logs()
    );
    assert!(d.child.try_wait().unwrap().is_none(), "delayd gave up");
    assert!(
        !d.logs().contains("secret-pw"),
        "password leaked to the log"
    );
    d.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_client_certificate_is_refused_with_a_clear_error() {
    let n = node();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("amqps://guest:guest@127.0.0.1:{}/%2f", n.tls);
    let (code, out) = check(dir.path(), &amqp_section(&url, Some("ca.crt"), false));
    assert_eq!(code, 1, "{out}");
    let line = amqp_line(&out);
    assert!(
        line.contains("client certificate") && line.contains("tls_cert_file"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_server_certificate_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let c = certs();
    // Any TLS server will do: the client gives up at the certificate. A
    // port taken between picking and binding makes s_server exit: try
    // another.
    let mut result = None;
    let mut why = String::new();
    for _ in 0..3 {
        let port = free_port(16000..19000, &[]);
        let log = dir.path().join(format!("s_server-{port}.log"));
        let mut server = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(c.join("expired.crt"))
            .arg("-key")
            .arg(c.join("expired.key"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("cannot start openssl s_server");
        let up = eventually(Duration::from_secs(20), || {
            let listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            let exited = matches!(server.try_wait(), Ok(Some(_)));
            async move { listening || exited }
        })
        .await
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if up {
            let url = format!("amqps://guest:guest@127.0.0.1:{port}/%2f");
            result = Some(check(dir.path(), &amqp_section(&url, Some("ca.crt"), true)));
        } else {
            why = std::fs::read_to_string(&log).unwrap_or_default();
        }
        let _ = server.kill();
        let _ = server.wait();
        if result.is_some() {
            break;
        }
    }
    let (code, out) = result.unwrap_or_else(|| panic!("openssl s_server did not listen: {why}"));
    assert_eq!(code, 1, "{out}");
    assert!(amqp_line(&out).contains("certificate has expired"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_text_server_behind_amqps_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let n = node();
    // The node's clear-text AMQP port, reached as if it spoke TLS.
    let url = format!("amqps://guest:guest@127.0.0.1:{}/%2f", n.amqp);
    let (code, out) = check(dir.path(), &amqp_section(&url, Some("ca.crt"), true));
    assert_eq!(code, 1, "{out}");
    assert!(amqp_line(&out).contains("did not answer in TLS"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_server_times_out_releases_each_socket_and_readyz_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // Accepts, never answers, and notes when delayd closes each connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(
        Vec::<(Instant, Option<Instant>)>::new(),
    ));
    let log = accepted.clone();
    let acceptor = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let i = {
                let mut l = log.lock().unwrap();
                l.push((Instant::now(), None));
                l.len() - 1
            };
            let log = log.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 1024];
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
                log.lock().unwrap()[i].1 = Some(Instant::now());
            });
        }
    });

    for scheme in ["amqp", "amqps"] {
        let url = format!("{scheme}://guest:guest@127.0.0.1:{port}/%2f");
        let section = amqp_section(&url, (scheme == "amqps").then_some("ca.crt"), false)
            .replace("connect_timeout = \"3s\"", "connect_timeout = \"1s\"");
        let started = Instant::now();
        let (code, out) = check(dir.path(), &section);
        assert_eq!(code, 1, "{out}");
        assert!(
            amqp_line(&out).contains("no answer within 1s"),
            "{scheme}: {out}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{out}");
    }

    // The daemon: retries, never hangs, closes every socket it gave up on.
    let section =
        format!("url = \"amqp://guest:guest@127.0.0.1:{port}/%2f\"\nconnect_timeout = \"1s\"");
    let (mut d, http) = start_listening(dir.path(), &section, "half_open");
    let before = accepted.lock().unwrap().len();
    let retried = eventually(Duration::from_secs(20), || async {
        accepted.lock().unwrap().len() >= before + 3
    })
    .await;
    assert!(retried, "delayd did not retry; log:\n{}", d.logs());
    let (code, body) = http_get(http, "/readyz").expect("/readyz answers");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("amqp: down") && body.contains("no answer within 1s"),
        "{body}"
    );
    assert!(d.child.try_wait().unwrap().is_none(), "delayd gave up");
    // Every attempt but the one under way has had its socket closed by
    // delayd, soon after its timeout.
    let conns = accepted.lock().unwrap().clone();
    let (done, open): (Vec<_>, Vec<_>) = conns[before..].iter().partition(|c| c.1.is_some());
    assert!(
        open.len() <= 1,
        "{} sockets left open: {conns:?}",
        open.len()
    );
    for (at, closed) in done {
        let held = closed.unwrap() - at;
        assert!(held < Duration::from_secs(3), "a socket was held {held:?}");
    }
    d.kill();
    acceptor.abort();
}
