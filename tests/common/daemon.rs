//! The daemon under test as a child process, the one-shot commands, and its
//! HTTP endpoints.

use super::*;

/// The binary the daemon tests run: this build's (cargo builds it beside
/// the test binaries, which run from its `deps/`), or `DELAYD_TEST_BIN` (to
/// show that a test fails against an older build).
pub fn daemon_bin() -> PathBuf {
    std::env::var_os("DELAYD_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the test binary's path");
            let deps = exe.parent().expect("the test binary's directory");
            deps.parent().unwrap_or(deps).join("delayd")
        })
}

/// The daemon as a child process, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `delayd run --config path`, logging to a file beside the config.
    pub fn start(config: &Path) -> Self {
        Self::start_with_env(config, &[])
    }

    /// Like [`Daemon::start`], with extra environment variables.
    pub fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Self {
        let log = config.with_extension(format!("{}.log", rand::random::<u32>()));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(daemon_bin())
            .args(["run", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("cannot start delayd");
        Self { child, log }
    }

    /// Sends a signal (e.g. `libc::SIGTERM`) to the daemon.
    pub fn signal(&self, sig: i32) {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits for exit; panics after `limit`.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "delayd did not exit within {limit:?}; log:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the daemon wrote to stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The port it serves /metrics on (`listen = "127.0.0.1:0"`), from its
    /// log; panics after 20 s.
    pub async fn metrics_port(&self) -> u16 {
        for _ in 0..400 {
            let port = self
                .logs()
                .split("listen=127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse::<u16>().ok());
            if let Some(p) = port {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the daemon never said where it serves /metrics:\n{}",
            self.logs()
        );
    }

    /// Asserts that the daemon logged `text`, showing the log's tail if not.
    #[track_caller]
    pub fn assert_logged(&self, text: &str) {
        assert!(
            self.logs().contains(text),
            "no {text:?} in:\n{}",
            self.tail()
        );
    }

    /// The last 40 lines of the daemon's log, for failure messages.
    pub fn tail(&self) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with arguments and returns (exit code, stdout, stderr).
pub fn delayd(args: &[&str]) -> (i32, String, String) {
    delayd_with_env(args, &[])
}

/// Like [`delayd`], with extra environment variables.
pub fn delayd_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(daemon_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("cannot run delayd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `GET path` on 127.0.0.1:port: (status code, body); `None` if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// The value of the sample `series` (name and labels, as /metrics prints
/// them) on the daemon at `port`: 0 when absent, `None` when nothing answers.
pub async fn metric(port: u16, series: &str) -> Option<u64> {
    let body = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .unwrap()?
        .1;
    Some(sample(&body, series))
}

/// The value of the sample `series` in a /metrics `body`: 0 when absent.
pub fn sample(body: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    body.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// What `delayd check` printed when it failed the one way a test expects.
pub struct CheckFailure {
    /// The one line of stdout that contains `FAILED`.
    pub line: String,
    pub out: String,
    pub err: String,
}

/// Runs `delayd check` on `config` and asserts it fails as a user should see
/// it: exit 1 within 10 s, exactly one `FAILED` line, one line on stderr, no
/// panic. Returns the output for the caller's own assertions on the line.
pub fn assert_check_fails(config: &Path) -> CheckFailure {
    let start = Instant::now();
    let (code, out, err) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "exit code {code}:\n{out}\n{err}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "check took {:?}",
        start.elapsed()
    );
    let failed: Vec<&str> = out.lines().filter(|l| l.contains("FAILED")).collect();
    assert_eq!(failed.len(), 1, "exactly one FAILED line expected:\n{out}");
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(!out.contains("panicked") && !err.contains("panicked"));
    CheckFailure {
        line: failed[0].to_string(),
        out,
        err,
    }
}

/// `delayd bench` on `config` with a short flow (2000 messages, one round
/// at 200 a second, a second each of lateness and idle) and `extra`
/// arguments: (exit code, stdout, stderr).
pub fn short_bench(config: &str, extra: &[&str]) -> (i32, String, String) {
    short_bench_with_env(config, extra, &[])
}

/// [`short_bench`] with extra environment variables.
pub fn short_bench_with_env(
    config: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let mut args = vec![
        "bench",
        "--config",
        config,
        "--messages",
        "2000",
        "--rounds",
        "1",
    ];
    args.extend(["--rate", "200", "--lateness-secs", "1", "--idle-secs", "1"]);
    args.extend_from_slice(extra);
    delayd_with_env(&args, env)
}
