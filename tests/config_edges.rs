//! What a user can type into the file or the environment reaches delayd as
//! written, is refused at load with one line when the broker or Redis could
//! not take it, and never shows a password.

use delayd_test_support as common;

use std::time::Duration;

use common::*;

#[test]
fn a_300_byte_exchange_is_refused_at_load_with_one_line_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = BusinessSpec::random("long");
    b.exchange = "x".repeat(300);
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    for cmd in ["check", "run"] {
        let (code, out, err) = delayd(&[cmd, "--config", config.to_str().unwrap()]);
        assert_eq!(code, 2, "{cmd}: exit {code}\n{out}\n{err}");
        assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
        assert!(
            err.contains(
                "business \"long\", field \"exchange\" must be at most 255 bytes (got 300)"
            ),
            "{cmd}: {err}"
        );
        assert!(!err.contains("panicked") && !out.contains("panicked"));
    }
}

#[test]
fn an_environment_value_that_is_not_utf8_is_refused_with_one_line_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("envbytes");
    let config = write_config(dir.path(), &redis_url(), &amqp_url(), &[&b]);
    let bad = std::ffi::OsStr::from_bytes(b"secret\xff<b>");
    let run = |name: &str| {
        let out = std::process::Command::new(daemon_bin())
            .args(["check", "--config", config.to_str().unwrap()])
            .env(name, bad)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // Ours: refused by name, value unshown.
    let (code, out, err) = run("DELAYD_AMQP__URL");
    assert_eq!(code, Some(2), "{out}\n{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("environment variable DELAYD_AMQP__URL is not valid UTF-8"),
        "{err}"
    );
    assert!(
        !err.contains("secret") && !err.contains("panicked"),
        "{err}"
    );
    // Not ours: no concern of delayd's, and no panic either.
    let (code, out, err) = run("SOME_OTHER_VARIABLE");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.contains("config") && out.contains(": ok"),
        "{code:?}\n{out}\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_key_from_the_environment_reaches_the_broker_as_written() {
    let mut b = BusinessSpec::random("envrk");
    // The queue is bound with "1.10"; "1.1" would go nowhere.
    b.routing_key = "1.10".into();
    let mut s = Setup::new(&[&b]).await;
    let text = std::fs::read_to_string(&s.config).unwrap().replace(
        "routing_key = \"1.10\"",
        "routing_key = \"from-the-environment\"",
    );
    std::fs::write(&s.config, text).unwrap();
    let _d = Daemon::start_with_env(
        &s.config,
        &[("DELAYD_BUSINESSES__ENVRK__ROUTING_KEY", "1.10")],
    );
    let now = redis_now_ms(&mut s.redis).await;
    zadd_many(
        &mut s.redis,
        &b.key,
        &[(now as f64, b"as-written".to_vec())],
    )
    .await;
    s.inboxes[0].wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(s.inboxes[0].all()[0].body, b"as-written");
}

/// One way a password can be written: what it is, the `[redis]` section,
/// the environment, and the password itself, which must appear nowhere.
struct PasswordForm {
    form: &'static str,
    redis_section: &'static str,
    env: Vec<(&'static str, String)>,
    secret: &'static str,
}

fn password_forms() -> Vec<PasswordForm> {
    vec![
        PasswordForm {
            form: "?pass= in a redis+unix URL",
            redis_section:
                "[redis]\nurl = \"redis+unix:///nonexistent/redis.sock?db=0&pass=Pq7sEcReT\"\n",
            env: vec![],
            secret: "Pq7sEcReT",
        },
        PasswordForm {
            form: "an unencoded / in the password",
            redis_section: "[redis]\nurl = \"redis://:Pq7/sEcReT@127.0.0.1:1/0\"\n",
            env: vec![],
            secret: "sEcReT",
        },
        PasswordForm {
            form: "a , in a password of DELAYD_AMQP__URLS",
            redis_section: "[redis]\nurl = \"redis://127.0.0.1:1/0\"\n",
            env: vec![(
                "DELAYD_AMQP__URLS",
                "amqp://guest:Pq7,sEcReT@127.0.0.1:1/%2f,amqp://guest:Pq7,sEcReT@127.0.0.1:2/%2f"
                    .to_string(),
            )],
            secret: "sEcReT",
        },
        PasswordForm {
            form: "?password= in a redis URL",
            redis_section: "[redis]\nurl = \"redis://127.0.0.1:1/0?password=Pq7sEcReT\"\n",
            env: vec![],
            secret: "Pq7sEcReT",
        },
    ]
}

#[test]
fn no_form_of_password_reaches_check_or_the_start_line() {
    let dir = tempfile::tempdir().unwrap();
    for p in password_forms() {
        let (form, secret) = (p.form, p.secret);
        let b = BusinessSpec::random("pw");
        let config = write_config_redis(dir.path(), p.redis_section, &amqp_url(), "off", &[&b]);
        let env: Vec<(&str, &str)> = p.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, out, err) =
            delayd_with_env(&["check", "--config", config.to_str().unwrap()], &env);
        assert_ne!(code, 0, "{form}: check passed?\n{out}\n{err}");
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{form}: the password is shown by check:\n{out}\n{err}"
        );
        // The daemon's start line (and whatever it logs while retrying).
        let mut d = Daemon::start_with_env(&config, &env);
        std::thread::sleep(Duration::from_millis(1500));
        d.kill();
        let logs = d.logs();
        assert!(!logs.is_empty(), "{form}: the daemon logged nothing");
        assert!(
            !logs.contains(secret),
            "{form}: the password is in the log:\n{logs}"
        );
    }
}
