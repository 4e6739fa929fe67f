//! `delayd adopt` against the real delayed-message plugin: nodes of the
//! set's RabbitMQ (3.10, or 4.0 on the RabbitMQ 4 sets) running the
//! archived plugin built for it from `deploy/local/vendor`
//! (`DELAYD_RABBITMQ_DELAYED_PLUGIN=1`), started once per node set for this
//! test binary (one node, a two-node cluster, one node a test restarts) and
//! killed by their watchers when it exits.
//! delayd reaches them through a rabbitmqctl wrapper that can kill it
//! (`kill -9` of its parent) before or after a given expression runs.
//! The tests run on a multi-threaded runtime: an `adopt` run blocks the
//! test's thread for seconds, and the consumers that stamp each receipt
//! time must go on running meanwhile.

use delayd_test_support as common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};

/// RabbitMQ nodes with the plugin, clustered when more than one.
struct Nodes {
    dir: PathBuf,
    ports: Vec<u16>,
}

fn start_nodes(label: &str, count: usize) -> Nodes {
    let dir = std::env::temp_dir().join(format!("delayd-adopt-{label}-{}", std::process::id()));
    let ports: Vec<u16> = (0..count).map(|_| rabbit_port()).collect();
    let mut args = vec!["start".to_string(), dir.display().to_string()];
    args.extend(ports.iter().map(|p| p.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_script("rabbitmq-cluster.sh", &args, &node_env());
    Nodes { dir, ports }
}

/// What every start of a node of this binary needs.
fn node_env() -> [(&'static str, String); 3] {
    [
        ("DELAYD_RABBITMQ_WATCH_PID", std::process::id().to_string()),
        ("DELAYD_RABBITMQ_DELAYED_PLUGIN", "1".into()),
        ("DELAYD_START_TIMEOUT", "180".into()),
    ]
}

fn one_node() -> &'static Nodes {
    static NODES: OnceLock<Nodes> = OnceLock::new();
    NODES.get_or_init(|| start_nodes("one", 1))
}

fn two_nodes() -> &'static Nodes {
    static NODES: OnceLock<Nodes> = OnceLock::new();
    NODES.get_or_init(|| start_nodes("two", 2))
}

/// A node of its own for the test that restarts it (the others share
/// theirs while it is down).
fn restarted_node() -> &'static Nodes {
    static NODES: OnceLock<Nodes> = OnceLock::new();
    NODES.get_or_init(|| start_nodes("restart", 1))
}

/// Starts every node set in the background when the first test begins:
/// the tests run two at a time, and those that begin later find their
/// nodes up. A set that failed to start is started again, and its error
/// reported, by the test that needs it.
fn start_all_node_sets() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let sets: [fn() -> &'static Nodes; 3] = [one_node, two_nodes, restarted_node];
        for set in sets {
            std::thread::spawn(move || {
                set();
            });
        }
    });
}

impl Nodes {
    fn url(&self, i: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.ports[i])
    }

    fn node(&self, i: usize) -> String {
        format!("delayd-test-{}@localhost", self.ports[i])
    }

    /// A rabbitmqctl for delayd: the node script's `ctl` (the cluster's
    /// cookie is in every node's HOME), which kills its caller with
    /// SIGKILL when `DIR/crash` says `read-before N`, `read-after N`,
    /// `commit-before N` or `commit-after N` and this is the Nth such
    /// expression (delayd's last argument) since the counts were reset.
    fn wrapper(&self, dir: &Path) -> String {
        let path = dir.join("rabbitmqctl");
        let node_script = deploy_script("rabbitmq-node.sh");
        let first = self.dir.join(format!("node-{}", self.ports[0]));
        std::fs::write(
            &path,
            format!(
                r#"#!/usr/bin/env bash
dir={dir}
case "$*" in *":commit("*) kind=commit ;; *":read("*) kind=read ;; *) kind=other ;; esac
n=$(( $(cat "$dir/count-$kind" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$dir/count-$kind"
crash=$(cat "$dir/crash" 2>/dev/null || true)
if [[ "$crash" == "$kind-before $n" ]]; then rm -f "$dir/crash"; kill -9 "$PPID"; exit 1; fi
{script} ctl {first} {port} "$@"
rc=$?
if [[ "$crash" == "$kind-after $n" ]]; then rm -f "$dir/crash"; kill -9 "$PPID"; exit 1; fi
exit $rc
"#,
                dir = dir.display(),
                script = node_script.display(),
                first = first.display(),
                port = self.ports[0],
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path.display().to_string()
    }

    /// Runs an Erlang expression on node `i` as the guide tells an
    /// operator to (`rabbitmqctl -n NODE eval_file FILE`, through the
    /// wrapper, which counts it as `other`); its output.
    fn eval(&self, ctl: &str, i: usize, expr: &str) -> String {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = Path::new(ctl).with_file_name(format!("expr-{n}.erl"));
        std::fs::write(&file, expr).unwrap();
        let out = std::process::Command::new(ctl)
            .args(["-n", &self.node(i), "eval_file", file.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "eval failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops node `i` gracefully and starts it again on the same state
    /// (rabbitmq-node.sh, as the cluster script started it).
    fn restart(&self, i: usize) {
        let port = self.ports[i].to_string();
        let dir = self.dir.join(format!("node-{port}"));
        let dir = dir.to_str().unwrap();
        let mut env = node_env().to_vec();
        env.push((
            "DELAYD_RABBITMQ_DIST_PORT",
            (self.ports[i] - 10_000).to_string(),
        ));
        run_script("rabbitmq-node.sh", &["stop", dir, &port], &env);
        run_script("rabbitmq-node.sh", &["start", dir, &port], &env);
    }

    /// Index keys the plugin on node `i` keeps for `exchange` (with or
    /// without entries).
    fn index_keys(&self, ctl: &str, i: usize, exchange: &str) -> u64 {
        let out = self.eval(
            ctl,
            i,
            &format!(
                "T = list_to_atom(\"rabbit_delayed_message\" ++ atom_to_list(node()) ++ \"_index\"),
                 length([K || K <- ets:tab2list(T), element(2, element(3, element(2, K))) =:= rabbit_misc:r(<<\"/\">>, exchange, <<\"{exchange}\">>)])."
            ),
        );
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("count: {out}"))
    }

    /// Messages the plugin on node `i` holds for `exchange`.
    fn held(&self, ctl: &str, i: usize, exchange: &str) -> u64 {
        let out = self.eval(
            ctl,
            i,
            &format!(
                "T = list_to_atom(\"rabbit_delayed_message\" ++ atom_to_list(node())),
                 length([E || E <- ets:tab2list(T), element(2, element(3, element(2, E))) =:= rabbit_misc:r(<<\"/\">>, exchange, <<\"{exchange}\">>)])."
            ),
        );
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("count: {out}"))
    }

    /// Whether the plugin's process on node `i` is suspended.
    fn suspended(&self, ctl: &str, i: usize) -> bool {
        self.eval(
            ctl,
            i,
            "lists:nth(2, element(4, sys:get_status(whereis(rabbit_delayed_message)))).",
        )
        .contains("suspended")
    }
}

/// The broker side of one test: the target exchange (bound to two queues:
/// one consumed with lapin, one read raw), a plugin exchange bound to its
/// own queue, and another plugin exchange no business names.
struct Topology {
    target: String,
    target_queue: String,
    raw_queue: String,
    plugin: String,
    plugin_queue: String,
    other: String,
    other_queue: String,
}

async fn topology(url: &str) -> Topology {
    let t = Topology {
        target: unique("target"),
        target_queue: unique("target-q"),
        raw_queue: unique("raw-q"),
        plugin: unique("plugin"),
        plugin_queue: unique("plugin-q"),
        other: unique("other"),
        other_queue: unique("other-q"),
    };
    let conn = amqp_at(url).await;
    let ch = conn.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let mut args = FieldTable::default();
    args.insert(
        "x-delayed-type".into(),
        AMQPValue::LongString(LongString::from("direct")),
    );
    ch.exchange_declare(
        t.target.as_str().into(),
        lapin::ExchangeKind::Direct,
        durable,
        FieldTable::default(),
    )
    .await
    .unwrap();
    for x in [&t.plugin, &t.other] {
        ch.exchange_declare(
            x.as_str().into(),
            lapin::ExchangeKind::Custom("x-delayed-message".into()),
            durable,
            args.clone(),
        )
        .await
        .unwrap();
    }
    for (x, q) in [
        (&t.target, &t.target_queue),
        (&t.target, &t.raw_queue),
        (&t.plugin, &t.plugin_queue),
        (&t.other, &t.other_queue),
    ] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            q.as_str().into(),
            x.as_str().into(),
            "rk".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    t
}

/// A config whose business delivers to `t.target`, with an intake under
/// another name (the plugin's exchange stays as it is).
fn config(dir: &Path, url: &str, t: &Topology, b: &mut BusinessSpec) -> PathBuf {
    b.exchange = t.target.clone();
    b.routing_key = "rk".into();
    b.extra = format!(
        "properties = \"bare\"\n[businesses.{}.intake]\nexchange = \"{}\"\nqueue = \"{}\"",
        b.name,
        unique("intake"),
        unique("intake-q")
    );
    write_config(dir, &redis_url(), url, &[b])
}

/// What each test starts from, on one node set: a rabbitmqctl wrapper,
/// the exchanges and queues, a business and its config in a directory of
/// the test's own.
struct Case {
    nodes: &'static Nodes,
    dir: tempfile::TempDir,
    ctl: String,
    /// The first node's URL and name.
    url: String,
    node: String,
    t: Topology,
    b: BusinessSpec,
    cfg: PathBuf,
}

impl Case {
    /// On the node set `nodes` (all sets start in the background first),
    /// with a business named from `label`.
    async fn on(nodes: fn() -> &'static Nodes, label: &str) -> Self {
        start_all_node_sets();
        let nodes = nodes();
        let dir = tempfile::tempdir().unwrap();
        let ctl = nodes.wrapper(dir.path());
        let url = nodes.url(0);
        let t = topology(&url).await;
        let mut b = BusinessSpec::random(label);
        let cfg = config(dir.path(), &url, &t, &mut b);
        Self {
            node: nodes.node(0),
            nodes,
            dir,
            ctl,
            url,
            t,
            b,
            cfg,
        }
    }

    /// A raw connection to the first node, to publish to the plugin with.
    async fn raw(&self) -> RawAmqp {
        RawAmqp::connect(&self.url).await
    }

    /// `delayd adopt` of the business with the wrapper, after resetting its
    /// counts and setting where it kills delayd (`None`: nowhere).
    fn adopt(&self, args: &[&str], crash: Option<&str>) -> (i32, String, String) {
        let dir = self.dir.path();
        for kind in ["read", "commit", "other"] {
            let _ = std::fs::remove_file(dir.join(format!("count-{kind}")));
        }
        match crash {
            Some(c) => std::fs::write(dir.join("crash"), c).unwrap(),
            None => {
                let _ = std::fs::remove_file(dir.join("crash"));
            }
        }
        let mut all = vec!["--rabbitmqctl", &self.ctl];
        all.extend_from_slice(args);
        self.adopt_offline(&all)
    }

    /// `delayd adopt` of the business without the wrapper: the two-step
    /// form, which reaches no node itself.
    fn adopt_offline(&self, args: &[&str]) -> (i32, String, String) {
        let cfg = self.cfg.to_str().unwrap();
        let mut all = vec!["adopt", "--config", cfg, "--business", &self.b.name];
        all.extend_from_slice(args);
        delayd(&all)
    }
}

/// No header fields beyond `x-delay`.
const NONE: Table = Table(Vec::new());

/// One message published to a plugin exchange.
struct Sent {
    body: String,
    delay_ms: i64,
    at_ms: i64,
    message_id: Option<String>,
}

/// Publishes `body` to `exchange` with `x-delay` (as a 64-bit integer,
/// which the plugin reads too), an optional `message_id` and `extra`
/// header fields.
async fn send(
    raw: &mut RawAmqp,
    exchange: &str,
    body: &str,
    delay_ms: i64,
    message_id: Option<&str>,
    extra: &Table,
) -> Sent {
    let mut headers = Table::default().field(b"x-delay", b'l', &delay_ms.to_be_bytes());
    headers.0.extend_from_slice(&extra.0);
    let props = RawProps {
        headers: Some(headers),
        delivery_mode: Some(2),
        message_id: message_id.map(|m| m.as_bytes().to_vec()),
        ..Default::default()
    };
    let at_ms = wall_ms();
    raw.publish(exchange, b"rk", &props.encode(), body.as_bytes())
        .await;
    Sent {
        body: body.into(),
        delay_ms,
        at_ms,
        message_id: message_id.map(str::to_string),
    }
}

/// Every header type the intake tests cover, in one table.
fn rich_headers() -> Table {
    let inner = Table::default()
        .field(b"z", b'I', &7i32.to_be_bytes())
        .field(b"a", b'S', &long_bytes(b"nested"));
    let mut array = vec![b'I'];
    array.extend_from_slice(&1i32.to_be_bytes());
    array.push(b'V');
    Table::default()
        .field(b"s8", b'b', &[0x80])
        .field(b"u8", b'B', &[0xff])
        .field(b"s16", b's', &i16::MIN.to_be_bytes())
        .field(b"u16", b'u', &u16::MAX.to_be_bytes())
        .field(b"s32", b'I', &i32::MIN.to_be_bytes())
        .field(b"u32", b'i', &u32::MAX.to_be_bytes())
        .field(b"s64", b'l', &i64::MIN.to_be_bytes())
        .field(b"f", b'f', &1.5f32.to_be_bytes())
        .field(b"d", b'd', &2.25f64.to_be_bytes())
        .field(b"dec", b'D', &[2, 0, 0, 0x30, 0x39])
        .field(b"str", b'S', &long_bytes(b"\x00\xff bin"))
        .field(b"bytes", b'x', &long_bytes(b"\x01\x02"))
        .field(b"ts", b'T', &1_700_000_000u64.to_be_bytes())
        .field(b"bool", b't', &[1])
        .field(b"void", b'V', b"")
        .field(b"table", b'F', &inner.as_value())
        .field(b"array", b'A', &long_bytes(&array))
}

/// Every body `inboxes` received, sorted.
fn sorted_bodies(inboxes: &[&Inbox]) -> Vec<Vec<u8>> {
    let mut bodies: Vec<Vec<u8>> = inboxes
        .iter()
        .flat_map(|i| i.all())
        .map(|r| r.body)
        .collect();
    bodies.sort();
    bodies
}

/// The members of `key` due within 1.5 s of `due` (epoch ms), with their
/// scores.
async fn stored_near(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    due: i64,
) -> Vec<(String, f64)> {
    let window = (key, due - 1_500, due + 1_500, "BYSCORE", "WITHSCORES");
    query(conn, "ZRANGE", window).await
}

/// The headers of a raw message, by body.
fn by_body(messages: &[RawMessage]) -> HashMap<String, &RawMessage> {
    messages
        .iter()
        .map(|m| (String::from_utf8_lossy(&m.body).into_owned(), m))
        .collect()
}

/// The whole story on one node: a backlog of delays from 40 s to the
/// plugin's longest, with and without `message_id` (two under one id),
/// every header type, beside another plugin exchange no business names;
/// delayd killed with SIGKILL after the Redis write of a chunk (before
/// its delete), after a read (the plugin held), and after a delete; then
/// reruns. Each message is delivered once, by delayd, never early; none by
/// the plugin after adoption; the plugin's table is empty for the exchange
/// and still delivers the other exchange's messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_survives_kill_9_at_each_step_and_delivers_each_message_once() {
    let c = Case::on(one_node, "adopted").await;
    let (t, b) = (&c.t, &c.b);
    let mut raw = c.raw().await;
    let x = t.plugin.as_str();
    let mut sent = vec![
        send(&mut raw, x, "s40", 40_000, Some("mid-s40"), &NONE).await,
        send(&mut raw, x, "s41", 41_000, None, &NONE).await,
        send(&mut raw, x, "dup-a", 42_000, Some("dup"), &NONE).await,
        send(&mut raw, x, "dup-b", 42_000, Some("dup"), &NONE).await,
        send(&mut raw, x, "types", 43_000, None, &rich_headers()).await,
        send(&mut raw, x, "due80", 80_000, Some("mid-80"), &NONE).await,
    ];
    let long = vec![
        send(&mut raw, x, "h1", 3_600_000, Some("mid-h1"), &NONE).await,
        send(&mut raw, x, "d1", 86_400_000, None, &NONE).await,
        send(&mut raw, x, "d30", 30 * 86_400_000, None, &NONE).await,
        send(&mut raw, x, "max", u32::MAX as i64, Some("mid-max"), &NONE).await,
    ];
    // Past 2^32 - 1 ms the plugin does not hold a message: it routes it at once.
    send(&mut raw, x, "d60", 60 * 86_400_000, None, &NONE).await;
    send(&mut raw, &t.other, "o45", 45_000, None, &NONE).await;
    send(&mut raw, &t.other, "oh", 3_600_000, None, &NONE).await;

    let (code, out, err) = c.adopt(&["--exchange", x, "--node", &c.node, "--dry-run"], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("exchange / {x}: 10 messages")),
        "{out}"
    );
    assert!(
        out.contains(&format!("exchange / {}: 2 messages", t.other)),
        "{out}"
    );

    // delayd runs throughout: what a killed adoption moved is delivered
    // while the plugin still holds what it only staged, and a rerun must
    // neither store a moved message again nor lose a staged one.
    let amqp = amqp_at(&c.url).await;
    let inbox = consume(&amqp, &t.target_queue).await;
    let plugin_inbox = consume(&amqp, &t.plugin_queue).await;
    let other_inbox = consume(&amqp, &t.other_queue).await;
    let _d = Daemon::start(&c.cfg);
    let run = |crash: Option<&'static str>| {
        c.adopt(&["--exchange", x, "--node", &c.node, "--chunk", "3"], crash)
    };
    // due80 is delivered on time once delayd holds it; when a slow broker
    // makes the adoption store it after its due time (the plugin is held
    // meanwhile), it is due from when it was stored.
    let mut conn = redis().await;
    let adopted_key = family(&b.key).adopted;
    let mut due80_stored: Option<i64> = None;
    // Killed once the second chunk is in Redis, before its delete.
    let (code, out, err) = run(Some("commit-before 2"));
    assert_eq!(code, -1, "killed: {out}{err}");
    note_stored(&mut conn, &adopted_key, "mid-80", &mut due80_stored).await;
    assert!(
        c.nodes.suspended(&c.ctl, 0),
        "the plugin stays held until a rerun"
    );
    // Held, the plugin delivers nothing: the short ones fall overdue, and
    // delayd delivers those of the chunks the killed run finished.
    let overdue = (sent[0].at_ms + 46_000 - wall_ms()).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(overdue)).await;
    // Killed with the first chunk read and the plugin held again.
    assert_eq!(run(Some("read-after 1")).0, -1);
    note_stored(&mut conn, &adopted_key, "mid-80", &mut due80_stored).await;
    // Killed after a delete ran, before delayd heard of it.
    assert_eq!(run(Some("commit-after 1")).0, -1);
    note_stored(&mut conn, &adopted_key, "mid-80", &mut due80_stored).await;
    let (code, out, err) = run(None);
    assert_eq!(code, 0, "{out}{err}");
    note_stored(&mut conn, &adopted_key, "mid-80", &mut due80_stored).await;
    // The other exchange's messages are left and listed; the one due
    // within the hold may have been delivered by the plugin since.
    assert!(out.contains("already there 0"), "{out}");
    assert!(
        out.contains(&format!("/ {}: 2", t.other)) || out.contains(&format!("/ {}: 1", t.other)),
        "{out}"
    );
    assert!(!c.nodes.suspended(&c.ctl, 0), "released");
    assert_eq!(
        c.nodes.held(&c.ctl, 0, x),
        0,
        "the plugin holds nothing of the exchange"
    );
    let (code, out, _) = run(None);
    assert_eq!(code, 0);
    assert!(
        out.contains("moved 0 into business"),
        "a rerun moves nothing: {out}"
    );

    // What the plugin delivered before a slow broker let the adoption reach
    // it (the plugin is held only while a chunk moves) was not adopted; d60
    // it never held. Each message is delivered once, by one of the two.
    let all_in = async {
        loop {
            if inbox.len() + plugin_inbox.len() > sent.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let names = |i: &Inbox| -> Vec<String> {
        i.all()
            .iter()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect()
    };
    if tokio::time::timeout(Duration::from_secs(60), all_in)
        .await
        .is_err()
    {
        let f = family(&b.key);
        let pending: Vec<(String, f64)> =
            query(&mut conn, "ZRANGE", (&f.pending, 0, -1, "WITHSCORES")).await;
        let inflight: Vec<(String, f64)> =
            query(&mut conn, "ZRANGE", (&f.inflight, 0, -1, "WITHSCORES")).await;
        let adopted: Vec<String> = query(&mut conn, "HVALS", &f.adopted).await;
        let dead: Vec<String> = query(&mut conn, "ZRANGE", (&f.dead, 0, -1)).await;
        panic!(
            "delayd delivered {:?} and the plugin {:?} of {} within 60 s; at {}: pending {pending:?}, in flight {inflight:?}, dead {dead:?}, adopted {adopted:?}; delayd's log:\n{}",
            names(&inbox),
            names(&plugin_inbox),
            sent.len() + 1,
            wall_ms(),
            _d.logs()
        );
    }
    inbox.settle(Duration::from_secs(2)).await;
    let by_delayd = names(&inbox);
    let by_plugin = names(&plugin_inbox);
    let mut both: Vec<String> = by_delayd.iter().chain(&by_plugin).cloned().collect();
    both.sort();
    let mut want: Vec<String> = sent.iter().map(|s| s.body.clone()).collect();
    want.push("d60".into());
    want.sort();
    assert_eq!(
        both, want,
        "each once, by delayd {by_delayd:?} or the plugin {by_plugin:?}"
    );
    assert!(by_plugin.contains(&"d60".to_string()), "{by_plugin:?}");

    // Every entry is recorded once; the long ones wait in Redis, due when
    // the plugin would have delivered them, under their message_id if any.
    let family = family(&b.key);
    let adopted: i64 = hlen(&mut conn, &family.adopted).await;
    assert_eq!(
        adopted as usize,
        10 - (by_plugin.len() - 1),
        "the plugin delivered {by_plugin:?}"
    );
    for s in &long {
        let due = s.at_ms + s.delay_ms;
        let ids = stored_near(&mut conn, &b.key, due).await;
        assert_eq!(ids.len(), 1, "{} due {due}: {ids:?}", s.body);
        if let Some(m) = &s.message_id {
            assert_eq!(&ids[0].0, m);
        }
    }
    // delayd delivers what it adopted never before it is due.
    let got = inbox.all();
    for s in sent.drain(..) {
        let Some(r) = got.iter().find(|r| r.body == s.body.as_bytes()) else {
            continue;
        };
        assert!(r.at_ms >= s.at_ms + s.delay_ms - 5, "{} not early", s.body);
        assert_eq!(r.message_id, s.message_id, "{}", s.body);
        if s.body == "due80" {
            let stored = due80_stored.expect("due80 was stored by the adoption");
            let due = (s.at_ms + s.delay_ms).max(stored);
            assert!(
                r.at_ms <= due + 1_500,
                "due80 on time: {} ms after it was due and in Redis",
                r.at_ms - due
            );
        }
    }
    // The plugin, resumed, goes on delivering the other exchange's messages.
    other_inbox.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(other_inbox.all()[0].body, b"o45");
    assert_eq!(c.nodes.held(&c.ctl, 0, &t.other), 1);

    // Properties and headers arrive as the intake delivers them.
    let mut raws = Vec::new();
    for _ in 0..by_delayd.len() {
        raws.push(raw.get_within(&t.raw_queue, Duration::from_secs(5)).await);
    }
    let raws = by_body(&raws);
    let Some(types) = raws.get("types") else {
        assert!(by_plugin.contains(&"types".to_string()));
        del_family(&mut conn, &b.key).await;
        return;
    };
    let mut published = Table::default().field(b"x-delay", b'l', &43_000i64.to_be_bytes());
    published.0.extend_from_slice(&rich_headers().0);
    assert_eq!(
        headers_of(&types.properties).unwrap(),
        as_the_intake_delivers(&parse_table(&published.0))
    );
    assert_eq!(types.routing_key, b"rk");
    del_family(&mut conn, &b.key).await;
}

/// A cluster keeps one backlog per node: adoption names both nodes and
/// empties both, each message delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_empties_the_backlog_of_every_node_of_a_cluster() {
    let c = Case::on(two_nodes, "clustered").await;
    let (t, b) = (&c.t, &c.b);
    let mut sent = Vec::new();
    for i in 0..2 {
        let mut raw = RawAmqp::connect(&c.nodes.url(i)).await;
        sent.push(
            send(
                &mut raw,
                &t.plugin,
                &format!("n{i}-soon"),
                60_000,
                None,
                &NONE,
            )
            .await,
        );
        sent.push(
            send(
                &mut raw,
                &t.plugin,
                &format!("n{i}-later"),
                3_600_000,
                None,
                &NONE,
            )
            .await,
        );
    }
    for i in 0..2 {
        assert_eq!(
            c.nodes.held(&c.ctl, i, &t.plugin),
            2,
            "node {i} holds its own"
        );
    }
    let (n0, n1) = (c.nodes.node(0), c.nodes.node(1));
    let (code, out, err) = c.adopt(
        &["--exchange", &t.plugin, "--node", &n0, "--node", &n1],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    for n in [&n0, &n1] {
        assert!(out.contains(&format!("node {n}: moved ")), "{out}");
    }
    for i in 0..2 {
        assert_eq!(c.nodes.held(&c.ctl, i, &t.plugin), 0);
    }
    // Each soon one once: by delayd, or by the plugin when a slow broker
    // let it fall due before the adoption reached it.
    let amqp = amqp_at(&c.nodes.url(0)).await;
    let inbox = consume(&amqp, &t.target_queue).await;
    let plugin_inbox = consume(&amqp, &t.plugin_queue).await;
    let _d = Daemon::start(&c.cfg);
    let both = || inbox.len() + plugin_inbox.len();
    assert!(
        eventually(Duration::from_secs(90), || async { both() >= 2 }).await,
        "{} of 2 delivered",
        both()
    );
    inbox.settle(Duration::from_secs(2)).await;
    assert_eq!(
        sorted_bodies(&[&inbox, &plugin_inbox]),
        vec![b"n0-soon".to_vec(), b"n1-soon".to_vec()]
    );
    let mut conn = redis().await;
    assert_eq!(
        zcard(&mut conn, &b.key).await,
        2,
        "the later two wait in Redis"
    );
    del_family(&mut conn, &b.key).await;
    drop(sent);
}

/// The two-step form: the printed export runs on the broker and writes a
/// file; `--from` takes it in and prints the delete; after it, the plugin
/// holds nothing of the exchange but what falls due within the margin,
/// and a second `--from` of the same file moves nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_step_form_moves_the_export_and_deletes_exactly_it() {
    // Not on the kill -9 test's node: its plugin stays held there for a
    // while, and a publish to a held plugin waits. The cluster test holds
    // this one only while a chunk moves.
    let c = Case::on(two_nodes, "twostep").await;
    let (t, b) = (&c.t, &c.b);
    let mut raw = c.raw().await;
    // Due within the margin, with room for a slow broker to run the
    // export, the take-in and the delete first.
    send(&mut raw, &t.plugin, "soon", 55_000, None, &NONE).await;
    send(&mut raw, &t.plugin, "later", 3_600_000, Some("l1"), &NONE).await;
    send(&mut raw, &t.plugin, "much-later", 7_200_000, None, &NONE).await;
    let file = c.dir.path().join("export.lines");
    let file = file.to_str().unwrap();
    let (code, export, err) = c.adopt_offline(&[
        "--exchange",
        &t.plugin,
        "--print-export",
        file,
        "--margin",
        "1m",
    ]);
    assert_eq!(code, 0, "{err}");
    c.nodes.eval(&c.ctl, 0, &export);
    let take_in = || c.adopt_offline(&["--exchange", &t.plugin, "--from", file]);
    let (code, delete, err) = take_in();
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("took in 2"), "{err}");
    assert!(err.contains("left 1 due within the margin"), "{err}");
    let out = c.nodes.eval(&c.ctl, 0, &delete);
    assert!(out.contains("delayd-adopt deleted 2"), "{out}");
    assert_eq!(
        c.nodes.held(&c.ctl, 0, &t.plugin),
        1,
        "the one due within the margin stays"
    );
    let (code, _, err) = take_in();
    assert_eq!(code, 0);
    assert!(
        err.contains("took in 0") && err.contains("already there 2"),
        "{err}"
    );
    let mut conn = redis().await;
    assert_eq!(zcard(&mut conn, &b.key).await, 2);
    del_family(&mut conn, &b.key).await;
}

/// A broker node restarted in the middle of an adoption: delayd killed
/// with a chunk staged in Redis and still in the plugin (which it holds),
/// the node stopped and started. The restarted plugin runs again and
/// delivers the chunk's message that falls due before the rerun; the rerun
/// drops delayd's copy of it (it says so), moves the rest and leaves
/// nothing of the exchange in the plugin's tables. Each message is
/// delivered once, by delayd or by the plugin, none by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_mid_adoption_delivers_each_message_once_and_the_rerun_finishes_the_move()
{
    let c = Case::on(restarted_node, "restarted").await;
    let (t, b) = (&c.t, &c.b);
    let mut raw = c.raw().await;
    let x = t.plugin.as_str();
    // Index order is due order: with --chunk 2 the first chunk holds s1
    // and s2 (moved), the second s3 and d1 (staged, then the node
    // restarts: its plugin delivers s3 before the rerun), the third d2
    // and d30.
    let mut sent = Vec::new();
    for (body, delay) in [
        ("s1", 20_000),
        ("s2", 21_000),
        ("s3", 30_000),
        ("d1", 86_400_000),
        ("d2", 2 * 86_400_000),
        ("d30", 30 * 86_400_000),
    ] {
        sent.push(send(&mut raw, x, body, delay, Some(body), &NONE).await);
    }
    send(&mut raw, &t.other, "oh", 3_600_000, None, &NONE).await;
    drop(raw);
    let run = |crash: Option<&'static str>| {
        c.adopt(&["--exchange", x, "--node", &c.node, "--chunk", "2"], crash)
    };
    let (code, out, err) = run(Some("commit-before 2"));
    assert_eq!(code, -1, "killed: {out}{err}");
    assert!(c.nodes.suspended(&c.ctl, 0), "held by the killed run");
    c.nodes.restart(0);
    assert!(
        !c.nodes.suspended(&c.ctl, 0),
        "a restarted node runs the plugin again"
    );
    assert_eq!(c.nodes.held(&c.ctl, 0, &t.other), 1);

    let amqp = amqp_at(&c.url).await;
    let inbox = consume(&amqp, &t.target_queue).await;
    let plugin_inbox = consume(&amqp, &t.plugin_queue).await;
    assert!(
        eventually(Duration::from_secs(90), || async {
            plugin_inbox.find(b"s3").is_some()
        })
        .await,
        "the restarted plugin delivers s3"
    );
    let _d = Daemon::start(&c.cfg);
    let (code, out, err) = run(None);
    assert_eq!(code, 0, "{out}{err}");

    // Each message once: s1 and s2 by delayd, s3 by the plugin, the
    // others wait in Redis.
    assert!(
        eventually(Duration::from_secs(30), || async { inbox.len() >= 2 }).await,
        "s1 and s2 delivered"
    );
    inbox.settle(Duration::from_secs(3)).await;
    assert_eq!(
        sorted_bodies(&[&inbox, &plugin_inbox]),
        vec![b"s1".to_vec(), b"s2".to_vec(), b"s3".to_vec()]
    );
    assert!(
        out.contains("moved 3")
            && out.contains("1 messages read from the plugin were delivered by the plugin itself"),
        "the rerun moves d1, d2 and d30 and says it dropped s3: {out}{err}"
    );
    assert!(!c.nodes.suspended(&c.ctl, 0), "released");
    assert_eq!(
        c.nodes.held(&c.ctl, 0, x),
        0,
        "no entry of the exchange left"
    );
    assert_eq!(c.nodes.index_keys(&c.ctl, 0, x), 0, "no index key left");
    assert_eq!(
        c.nodes.held(&c.ctl, 0, &t.other),
        1,
        "the other exchange's stays"
    );
    let mut conn = redis().await;
    let family = family(&b.key);
    let adopted: i64 = hlen(&mut conn, &family.adopted).await;
    assert_eq!(adopted, 5, "each entry delayd moved recorded once");
    let staged: i64 = hlen(&mut conn, &family.staged).await;
    assert_eq!(staged, 0, "nothing left staged");
    for s in &sent[3..] {
        let due = s.at_ms + s.delay_ms;
        let ids = stored_near(&mut conn, &b.key, due).await;
        assert_eq!(ids.len(), 1, "{} due {due}: {ids:?}", s.body);
        assert_eq!(Some(&ids[0].0), s.message_id.as_ref());
    }
    sent.clear();
    del_family(&mut conn, &b.key).await;
}

/// Records the wall time by which the adoption had first stored task `id`
/// (its record in the business's `adopted` hash).
async fn note_stored(
    conn: &mut redis::aio::MultiplexedConnection,
    adopted: &str,
    id: &str,
    stored: &mut Option<i64>,
) {
    if stored.is_none() {
        let ids: Vec<String> = query(conn, "HVALS", adopted).await;
        if ids.iter().any(|i| i == id) {
            *stored = Some(wall_ms());
        }
    }
}
