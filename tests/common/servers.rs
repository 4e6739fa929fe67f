//! Private servers for tests that stop, kill or reconfigure them: free ports,
//! a private Redis, a private RabbitMQ node, the deploy/local scripts and
//! their certificates.

use super::*;

/// Ports handed out in this process, so two tests never pick the same one
/// before either server has bound it.
static TAKEN_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Claims `port` for this process among every test process on the machine
/// (a file naming its pid), so another test binary or matrix set does not
/// take it while a server here is down between a stop and its restart.
/// A claim whose process has ended is taken over.
fn reserve_port(port: u16) -> bool {
    let dir = std::env::temp_dir().join("delayd-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(port.to_string());
    let me = std::process::id().to_string();
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => return f.write_all(me.as_bytes()).is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let owner = std::fs::read_to_string(&path).unwrap_or_default();
                let owner = owner.trim();
                if owner == me {
                    return true;
                }
                if !owner.is_empty() && Path::new("/proc").join(owner).exists() {
                    return false;
                }
                // Ended (or still writing its pid: then create_new loses).
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => return false,
        }
    }
    false
}

/// A random port in `range` on which nothing listens, nor on `port + offset`
/// for each of `also` (RabbitMQ's Erlang distribution port, for one), and
/// which no other test process has claimed. Every port lies below the
/// kernel's ephemeral range (32768 up): there a port nothing listens on yet,
/// or one a restarted server is about to bind again, can be taken by any
/// outgoing connection of the tests beside it.
pub fn free_port(range: std::ops::Range<u16>, also: &[u16]) -> u16 {
    let top = range.end as u32 + also.iter().copied().max().unwrap_or(0) as u32;
    assert!(
        top <= 32768,
        "free_port({range:?}, {also:?}) reaches the ephemeral range (32768 up)"
    );
    let mut taken = TAKEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let p = rand::random_range(range.clone());
        let all: Vec<u16> = std::iter::once(p)
            .chain(also.iter().map(|o| p + o))
            .collect();
        if all.iter().any(|q| taken.contains(q)) {
            continue;
        }
        if all.iter().all(|q| port_free(*q)) && all.iter().all(|q| reserve_port(*q)) {
            taken.extend(all);
            return p;
        }
    }
    panic!("no free port in {range:?}");
}

/// A private `redis-server` (AOF on, fsync on every write) on its own port
/// and directory, for tests that stop and restart Redis. Killed when dropped.
pub struct PrivateRedis {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Picks a free port; the server is not started yet.
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join(format!("redis-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port: free_port(10000..20000, &[]),
            dir,
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A server in a directory under `dir`, started (blocking: call it
    /// from `block_in_place` in an async test).
    pub fn started(dir: &Path) -> Self {
        let mut server = Self::new(dir);
        server.start();
        server
    }

    /// A server kept in memory only (no AOF: a write never waits on the
    /// disk, which the builds beside the tests keep busy), started.
    pub fn started_in_memory(dir: &Path) -> Self {
        let mut server = Self::new(dir);
        server.start_with(&["--appendonly", "no"]);
        server
    }

    /// Starts the server on its port and directory (keeping any data there)
    /// and waits until it answers PING; panics after 20 s.
    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// [`PrivateRedis::start`] with `extra` arguments after the usual ones
    /// (a later one wins).
    pub fn start_with(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "private Redis already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .unwrap();
        // A session of its own, as the shared servers have: with the
        // kernel's scheduler autogroups a session shares the CPU as one
        // group, and inside the test's own group this server waits behind
        // every test of the binary and their daemons (a console read on
        // one ran past the API's 5 s bound in a bare CI run). `setsid`
        // execs in place here (the test is not a group leader): the pid is
        // Redis's.
        let child = Command::new("setsid")
            .arg("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--notify-keyspace-events",
                "Kz",
                "--daemonize",
                "no",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cannot start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while !self.answers() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "private Redis on port {} did not answer within 20s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True when the server answers PING with PONG (not LOADING).
    pub fn answers(&self) -> bool {
        use std::io::Read;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    /// Sends `signal` (e.g. `STOP` to freeze the server, `CONT` to thaw it).
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("private Redis not running");
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status();
    }

    /// SIGTERM (Redis flushes its AOF and exits) and waits; panics after 20 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("private Redis on port {} ignored SIGTERM", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection to this server.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis_at(&self.url()).await
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A private RabbitMQ node run by `deploy/local/rabbitmq-node.sh`
/// (`DELAYD_TEST_RABBITMQ_NODE_SCRIPT`), its state in its own directory, so
/// a test can stop and restart the broker. Killed when dropped.
pub struct PrivateRabbit {
    pub port: u16,
    pub dir: PathBuf,
    running: bool,
}

impl PrivateRabbit {
    /// Picks a free AMQP port (and its distribution port, +10000); not
    /// started. Both lie below the kernel's ephemeral range (32768 up): while
    /// the node is down between a stop and a start, an outgoing connection
    /// could take a port in it (a restart failed so, on distribution port
    /// 32930, in a bare run at `66277a0`).
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join(format!("rabbit-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            port: free_port(16000..22000, &[10000]),
            dir,
            running: false,
        }
    }

    /// A node in a directory under `dir`, started; `advanced` is its
    /// `advanced.config` (Erlang terms), or empty for none.
    pub async fn started(dir: &Path, advanced: &str) -> Self {
        let mut node = Self::new(dir);
        if !advanced.is_empty() {
            node.advanced_config(advanced);
        }
        node.start().await;
        node
    }

    /// Writes `advanced.config` (Erlang terms) before the first start, e.g.
    /// `[{rabbit, [{max_message_size, 1048576}]}].`
    pub fn advanced_config(&self, terms: &str) {
        std::fs::write(self.dir.join("advanced.config"), terms).unwrap();
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn script() -> PathBuf {
        std::env::var_os("DELAYD_TEST_RABBITMQ_NODE_SCRIPT")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("deploy/local/rabbitmq-node.sh"))
    }

    async fn run(&self, cmd: &str, limit: Duration) {
        let out = tokio::time::timeout(
            limit,
            tokio::process::Command::new(Self::script())
                .arg(cmd)
                .arg(&self.dir)
                .arg(self.port.to_string())
                .env("DELAYD_START_TIMEOUT", limit.as_secs().to_string())
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("rabbitmq-node.sh {cmd} took longer than {limit:?}"))
        .expect("cannot run rabbitmq-node.sh");
        assert!(
            out.status.success(),
            "rabbitmq-node.sh {cmd} {} {} failed: {}",
            self.dir.display(),
            self.port,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the node (or restarts it on the same directory) and waits
    /// until it has fully booted.
    pub async fn start(&mut self) {
        self.running = true;
        self.run("start", Duration::from_secs(90)).await;
    }

    /// Runs `rabbitmqctl ARGS` against the node; panics if it fails.
    pub async fn ctl(&self, args: &[&str]) {
        let out = tokio::process::Command::new(Self::script())
            .arg("ctl")
            .arg(&self.dir)
            .arg(self.port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("cannot run rabbitmq-node.sh");
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} failed: {}\nthe node's stdout.log ends:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
    }

    /// The last 30 lines of the node's `stdout.log`, for failure messages:
    /// the node's directory is gone once a failed test has ended.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Graceful stop; returns once the AMQP port is closed.
    pub async fn stop(&mut self) {
        self.run("stop", Duration::from_secs(90)).await;
        self.running = false;
    }

    /// SIGKILL of the node's Erlang VM, as a crash; [`PrivateRabbit::start`]
    /// brings it back on its data.
    pub async fn kill(&mut self) {
        self.run("kill", Duration::from_secs(30)).await;
        self.running = false;
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if self.running {
            let _ = Command::new(Self::script())
                .arg("kill")
                .arg(&self.dir)
                .arg(self.port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Restores the broker's memory watermark however the test ends.
pub struct Alarm<'a>(pub &'a PrivateRabbit);

impl Alarm<'_> {
    /// Raises a memory alarm: RabbitMQ blocks every connection that publishes.
    pub async fn raise(&self) {
        self.0
            .ctl(&["set_vm_memory_high_watermark", "0.000001"])
            .await;
    }
    /// Clears it.
    pub async fn clear(&self) {
        self.0.ctl(&["set_vm_memory_high_watermark", "0.4"]).await;
    }
}

impl Drop for Alarm<'_> {
    fn drop(&mut self) {
        let _ = Command::new(PrivateRabbit::script())
            .arg("ctl")
            .arg(&self.0.dir)
            .arg(self.0.port.to_string())
            .args(["set_vm_memory_high_watermark", "0.4"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `deploy/local/NAME ARGS` with extra environment; its stdout, or a
/// panic with its stderr. The scripts bound their own waits.
pub fn run_script(name: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let path = repo_root().join("deploy/local").join(name);
    let out = Command::new(&path)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{name} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Test certificates from `deploy/local/certs.sh`, made once per test binary.
pub fn certs() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("delayd-certs-{}", std::process::id()));
        run_script("certs.sh", &[dir.to_str().unwrap()], &[]);
        dir
    })
}

/// An AMQP port in 22000..25000 whose distribution port (AMQP - 10000) is
/// free too: the range private RabbitMQ nodes of the TLS and cluster tests use.
/// Both lie below the kernel's ephemeral range (32768 up), so an outgoing
/// connection cannot take a node's port while `join_cluster` has its
/// listener closed.
pub fn rabbit_port() -> u16 {
    free_port(12000..15000, &[10000]) + 10000
}

/// Ends `pids` (servers a test started once for its whole binary, which no
/// destructor stops) when this test process exits, however it exits.
pub fn reap_with_this_process(pids: &[u32]) {
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let _ = Command::new("setsid")
        .args([
            "bash",
            "-c",
            "while kill -0 \"$1\" 2>/dev/null; do sleep 0.5; done; shift; kill -KILL \"$@\" 2>/dev/null",
            "_",
            &std::process::id().to_string(),
        ])
        .args(&list)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A script under `deploy/local/`.
pub fn deploy_script(name: &str) -> PathBuf {
    repo_root().join("deploy/local").join(name)
}

/// `deploy/local/clients.sh WHAT`: installs a producer's client library if
/// needed and returns what the script prints (an interpreter, a path).
pub fn client(what: &str) -> String {
    run_script("clients.sh", &[what], &[]).trim().to_string()
}

/// The one fenced block of `lang` in `docs/DOC`, as the docs show it.
pub fn doc_block(doc: &str, lang: &str) -> String {
    let path = repo_root().join("docs").join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let open = format!("```{lang}\n");
    let blocks: Vec<&str> = text.split(&open).skip(1).collect();
    assert_eq!(blocks.len(), 1, "docs/{doc} must have one ```{lang} block");
    blocks[0].split("\n```").next().unwrap().to_string()
}

/// Runs `cmd` (a snippet, a tool) and returns its output; panics with
/// `what`, its stdout and its stderr if it fails.
pub fn output_ok(mut cmd: Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{what} failed:\n{stdout}{stderr}");
    out
}
