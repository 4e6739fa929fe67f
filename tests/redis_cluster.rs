//! delayd on a real Redis Cluster (3 masters, 3 replicas, started once for
//! this test binary by `deploy/local/redis-cluster.sh`): sharded drains,
//! a master killed or failed over mid-flow, a slot resharded mid-flow, and
//! keyspace wake-ups on every master. The tests take turns: several change
//! the cluster's topology.

use delayd_test_support as common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use redis::aio::ConnectionLike;

struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// One test at a time: failovers and resharding change what the others see.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        // Ports one by one: on a busy machine any port of a block may be
        // taken; the bus ports apart (Redis's default, port + 10000, is
        // not checked).
        let ports: Vec<u16> = (0..6).map(|_| free_port(10000..15000, &[])).collect();
        let buses: Vec<String> = (0..6)
            .map(|_| free_port(20000..25000, &[]).to_string())
            .collect();
        let list: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
        let out = std::process::Command::new(deploy_script("redis-cluster.sh"))
            .args(["start", dir.to_str().unwrap(), &list.join(",")])
            .arg(std::process::id().to_string())
            .env("DELAYD_CLUSTER_BUS_PORTS", buses.join(","))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("cannot run redis-cluster.sh");
        assert!(
            out.status.success(),
            "redis-cluster.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster { dir, ports }
    })
}

impl Cluster {
    fn ports(&self) -> Vec<u16> {
        self.ports.clone()
    }

    fn section(&self) -> String {
        format!(
            "[redis]\nmode = \"cluster\"\nurls = [\"redis://127.0.0.1:{}\", \"redis://127.0.0.1:{}\"]\n",
            self.ports[0], self.ports[1]
        )
    }

    async fn conn(&self) -> redis::cluster_async::ClusterConnection {
        let nodes: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        redis::cluster::ClusterClientBuilder::new(nodes)
            .retries(10)
            .max_retry_wait(1000)
            .response_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }

    /// The nodes as a live node sees them.
    async fn nodes(&self) -> Vec<Node> {
        self.nodes_seen_by(&self.ports()).await
    }

    /// The nodes as the first of `ports` that answers sees them.
    async fn nodes_seen_by(&self, ports: &[u16]) -> Vec<Node> {
        for &p in ports {
            let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{p}")) else {
                continue;
            };
            let Ok(Ok(mut c)) = tokio::time::timeout(
                Duration::from_secs(2),
                client.get_multiplexed_async_connection(),
            )
            .await
            else {
                continue;
            };
            if let Ok(text) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut c)
                .await
            {
                return parse_nodes(&text);
            }
        }
        panic!("no cluster node answers CLUSTER NODES");
    }

    async fn master_of_slot(&self, slot: u16) -> Node {
        self.nodes()
            .await
            .into_iter()
            .find(|n| n.master && n.slots.iter().any(|&(a, b)| slot >= a && slot <= b))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    async fn replica_of(&self, master: &Node) -> Node {
        self.nodes()
            .await
            .into_iter()
            .find(|n| n.master_id == master.id)
            .unwrap_or_else(|| panic!("{} has no replica", master.port))
    }

    /// Back to 3 masters with a replica each, every node ok.
    fn wait_ready(&self) {
        run_script(
            "redis-cluster.sh",
            &["wait", self.dir.to_str().unwrap()],
            &[],
        );
    }

    fn script(&self, cmd: &str, port: u16) {
        run_script(
            "redis-cluster.sh",
            &[cmd, self.dir.to_str().unwrap(), &port.to_string()],
            &[],
        );
    }
}

#[derive(Debug, Clone)]
struct Node {
    id: String,
    port: u16,
    master: bool,
    master_id: String,
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || f[2].contains("fail") && !f[2].contains("fail?") {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            Some(Node {
                id: f[0].to_string(),
                port,
                master: f[2].contains("master"),
                master_id: f[3].to_string(),
                slots: f[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|x| (x, x)),
                    })
                    .collect(),
            })
        })
        .collect()
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("cannot run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A business on the cluster with a consumer on its queue.
struct Flow {
    _consumers: Consumers,
    b: BusinessSpec,
    keys: Vec<String>,
    config: PathBuf,
    inbox: Inbox,
}

/// Three spread shards with a 3 s lease: a flow that fails over mid-way.
const SPREAD_3S_LEASE: &str = "shards = 3\nshard_names = \"spread\"\nlease = \"3s\"";

/// The cluster for this test alone while it holds the guard, a [`flow`]
/// on it, and a connection.
async fn serial_flow(
    name: &str,
    extra: &str,
) -> (
    tokio::sync::MutexGuard<'static, ()>,
    &'static Cluster,
    Flow,
    redis::cluster_async::ClusterConnection,
) {
    let turn = SERIAL.lock().await;
    let c = cluster();
    let f = flow(name, extra).await;
    let conn = c.conn().await;
    (turn, c, f, conn)
}

async fn flow(name: &str, extra: &str) -> Flow {
    let mut b = BusinessSpec::random(name);
    b.extra = extra.to_string();
    flow_of(b).await
}

async fn flow_of(b: BusinessSpec) -> Flow {
    let c = Consumers::on(&amqp_url(), &[&b]).await;
    let config = write_config_redis(
        c.dir.path(),
        &cluster().section(),
        &amqp_url(),
        "off",
        &[&b],
    );
    let keys = delayd::config::load(&config).unwrap().businesses[0].keys();
    Flow {
        inbox: c.inbox(),
        _consumers: c,
        b,
        keys,
        config,
    }
}

impl Flow {
    /// Whether the business has tenants.
    fn tenants(&self) -> bool {
        self.b.extra.contains("tenants = true")
    }

    /// Schedules `per_shard` members on every shard, due evenly over
    /// `over` from now; bodies are `s<shard>-<i>`. With tenants, member
    /// `i` goes to tenant `t<i mod 4>`, as producers write it.
    async fn schedule(&self, conn: &mut impl ConnectionLike, per_shard: usize, over: Duration) {
        let now = redis_now_ms(conn).await;
        for (s, key) in self.keys.iter().enumerate() {
            let items: Vec<(f64, Vec<u8>)> = (0..per_shard)
                .map(|i| {
                    let due = now + (over.as_millis() as usize * i / per_shard.max(1)) as i64;
                    (due as f64, format!("s{s}-{i}").into_bytes())
                })
                .collect();
            if !self.tenants() {
                zadd_many(conn, key, &items).await;
                continue;
            }
            for t in 0..4 {
                let mine: Vec<(f64, Vec<u8>)> = items.iter().skip(t).step_by(4).cloned().collect();
                zadd_tenant(conn, key, &format!("t{t}"), &mine).await;
            }
        }
    }

    fn expected(&self, per_shard: usize) -> Vec<Vec<u8>> {
        (0..self.keys.len())
            .flat_map(|s| (0..per_shard).map(move |i| format!("s{s}-{i}").into_bytes()))
            .collect()
    }

    /// Waits until every expected member arrived at least once; panics
    /// with the missing count after `limit`.
    async fn wait_all(
        &self,
        per_shard: usize,
        limit: Duration,
        daemon: &Daemon,
    ) -> HashMap<Vec<u8>, usize> {
        let want = self.expected(per_shard);
        let start = Instant::now();
        loop {
            let seen = counts(&self.inbox);
            let missing = want.iter().filter(|m| !seen.contains_key(*m)).count();
            if missing == 0 {
                return seen;
            }
            if start.elapsed() > limit {
                panic!(
                    "{missing} of {} members never arrived within {limit:?}; log:\n{}",
                    want.len(),
                    daemon.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn assert_empty(&self, conn: &mut redis::cluster_async::ClusterConnection) {
        for k in &self.keys {
            wait_drained(conn, k, Duration::from_secs(30)).await;
            // Claim records are deleted with the last settle of their claim.
            assert!(
                eventually(Duration::from_secs(10), || {
                    let mut c = conn.clone();
                    let k = k.clone();
                    async move { family_empty(&mut c, &k).await }
                })
                .await,
                "key family of {k} not empty"
            );
        }
    }

    /// When the first member of `shard` arrived after `t` (wall ms).
    fn first_after(&self, shard: usize, t: i64) -> Option<i64> {
        let prefix = format!("s{shard}-");
        self.inbox
            .all()
            .iter()
            .filter(|r| r.at_ms > t && r.body.starts_with(prefix.as_bytes()))
            .map(|r| r.at_ms)
            .min()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_drain_spreads_over_masters_and_delivers_exactly_once() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    let f = flow(
        "spread",
        "shards = 6\nshard_names = \"spread\"\nscanners = 2",
    )
    .await;
    // The spread naming puts two of six shards on each master.
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for k in &f.keys {
        *per_master
            .entry(c.master_of_slot(delayd::keys::slot(k)).await.port)
            .or_default() += 1;
    }
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(per_master.values().all(|n| *n == 2), "{per_master:?}");

    let mut conn = c.conn().await;
    f.schedule(&mut conn, 500, Duration::ZERO).await;
    let daemon = Daemon::start(&f.config);
    let seen = f.wait_all(500, Duration::from_secs(60), &daemon).await;
    f.inbox.settle(Duration::from_millis(500)).await;
    let seen = counts(&f.inbox)
        .into_iter()
        .chain(seen)
        .collect::<HashMap<_, _>>();
    assert_eq!(seen.len(), 3000);
    let twice = counts(&f.inbox).values().filter(|c| **c > 1).count();
    assert_eq!(twice, 0, "{twice} members arrived twice on a clean run");
    f.assert_empty(&mut conn).await;
    assert!(!daemon.logs().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_business_reads_the_documented_index_names_on_a_cluster_too() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    // No shard_names: the same names as on a standalone server.
    let f = flow("indexnames", "shards = 6\nscanners = 1").await;
    let want: Vec<String> = (0..6).map(|i| format!("{}:{i}", f.b.key)).collect();
    assert_eq!(f.keys, want, "the documented K:0 .. K:5");
    let mut conn = c.conn().await;
    f.schedule(&mut conn, 200, Duration::ZERO).await;
    let daemon = Daemon::start(&f.config);
    f.wait_all(200, Duration::from_secs(60), &daemon).await;
    f.inbox.settle(Duration::from_millis(500)).await;
    let seen = counts(&f.inbox);
    assert_eq!(seen.len(), 1200, "every member of the six documented keys");
    assert!(seen.values().all(|n| *n == 1), "a member arrived twice");
    f.assert_empty(&mut conn).await;
    // And check says spread names would use every master.
    let (code, out, _) = delayd(&["check", "--config", f.config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("shard_names = \"spread\""), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_prints_placement_and_shards_prints_the_names() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    let f = flow("placement", "shards = 3\nshard_names = \"spread\"").await;
    let cfg = f.config.to_str().unwrap();
    let (code, out, err) = delayd(&["shards", "--config", cfg, &f.b.name]);
    assert_eq!(code, 0, "{err}");
    let names: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(names, f.keys.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let (code, out, err) = delayd(&["check", "--config", cfg]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("3 masters"), "{out}");
    for (i, k) in f.keys.iter().enumerate() {
        let m = c.master_of_slot(delayd::keys::slot(k)).await;
        let line = format!(
            "shard {i} \"{k}\" -> slot {} -> 127.0.0.1:{}",
            delayd::keys::slot(k),
            m.port
        );
        assert!(out.contains(&line), "{line} missing from:\n{out}");
    }
    assert!(!out.contains("WARNING"), "{out}");

    // K:0..K:2 on a key where two shards share a master: check warns.
    let nodes = c.nodes().await;
    let owner = |slot: u16| {
        nodes
            .iter()
            .find(|n| n.master && n.slots.iter().any(|&(a, b)| slot >= a && slot <= b))
            .map(|n| n.port)
    };
    let key = (0..)
        .map(|n| format!("test:crowded:{n}"))
        .find(|key| {
            let owners: std::collections::HashSet<Option<u16>> = (0..3)
                .map(|i| owner(delayd::keys::slot(&format!("{key}:{i}"))))
                .collect();
            // CRC16 is linear: K:0 and K:2 differ in slot bit 13, so
            // they never share a master of three; two masters is the worst.
            owners.len() == 2 && !owners.contains(&None)
        })
        .unwrap();
    let mut b = BusinessSpec::random("crowded");
    b.key = key;
    b.extra = "shards = 3\nshard_names = \"index\"".into();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_redis(dir.path(), &c.section(), &amqp_url(), "off", &[&b]);
    let amqp = amqp_at(&amqp_url()).await;
    declare_exchange(&amqp.create_channel().await.unwrap(), &b.exchange).await;
    let (code, out, _) = delayd(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("WARNING: master(s)") && out.contains("hold no shard"),
        "{out}"
    );
    assert!(out.contains("holds 2 of 3 shards"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_mid_flow_loses_nothing_and_delivery_resumes() {
    kill_a_master_mid_flow("kill", SPREAD_3S_LEASE).await;
}

/// The same kill on a business with tenants: members wait in their
/// tenants' sets, which fail over with `K` (one slot per shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_mid_flow_of_a_business_with_tenants_loses_nothing_and_delivery_resumes() {
    kill_a_master_mid_flow(
        "kill_tenants",
        &format!("{SPREAD_3S_LEASE}\ntenants = true"),
    )
    .await;
}

/// 1,000 members on each of three shards due over 8 s; shard 0's master
/// killed once 300 arrived: every member arrives, shard 0 resumes within
/// 10 s, and the families (and the tenants' keys) empty.
async fn kill_a_master_mid_flow(name: &str, extra: &str) {
    let (_turn, c, f, mut conn) = serial_flow(name, extra).await;
    f.schedule(&mut conn, 1000, Duration::from_secs(8)).await;
    let victim = c.master_of_slot(delayd::keys::slot(&f.keys[0])).await;
    let daemon = Daemon::start(&f.config);
    f.inbox.wait_for(300, Duration::from_secs(30)).await;
    let killed_at = wall_ms();
    c.script("kill-node", victim.port);
    let seen = f.wait_all(1000, Duration::from_secs(90), &daemon).await;
    let resumed = f
        .first_after(0, killed_at + 500)
        .expect("shard 0 never delivered after the kill");
    assert!(
        resumed - killed_at <= 10_000,
        "shard 0 resumed {} ms after its master died",
        resumed - killed_at
    );
    assert_eq!(seen.len(), 3000);
    f.assert_empty(&mut conn).await;
    drop(daemon);
    // The old master comes back as a replica of its successor.
    c.script("start-node", victim.port);
    c.wait_ready();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_failover_mid_flow_loses_nothing() {
    let (_turn, c, f, mut conn) = serial_flow("failover", SPREAD_3S_LEASE).await;
    f.schedule(&mut conn, 1000, Duration::from_secs(6)).await;
    let master = c.master_of_slot(delayd::keys::slot(&f.keys[1])).await;
    let replica = c.replica_of(&master).await;
    let daemon = Daemon::start(&f.config);
    f.inbox.wait_for(300, Duration::from_secs(30)).await;
    let reply = cli(replica.port, &["CLUSTER", "FAILOVER"]);
    assert!(reply.contains("OK"), "{reply}");
    let seen = f.wait_all(1000, Duration::from_secs(60), &daemon).await;
    assert_eq!(seen.len(), 3000);
    f.assert_empty(&mut conn).await;
    drop(daemon);
    c.wait_ready();
}

/// `wait` (the cluster ready again) used to trust each node's own state,
/// which is ok at once after a failover while the other nodes still show
/// the old pairs: a test reading the pairs next found a master "with no
/// replica". Ready now means every node sees three masters, each with one
/// replica, and no node failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_cluster_is_ready_only_once_every_node_sees_three_whole_pairs() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    c.wait_ready();
    let master = c.master_of_slot(0).await;
    let replica = c.replica_of(&master).await;
    let reply = cli(replica.port, &["CLUSTER", "FAILOVER"]);
    assert!(reply.contains("OK"), "{reply}");
    c.wait_ready();
    for p in c.ports() {
        let nodes = c.nodes_seen_by(&[p]).await;
        let masters: Vec<&Node> = nodes.iter().filter(|n| n.master).collect();
        let whole = masters
            .iter()
            .filter(|m| nodes.iter().filter(|n| n.master_id == m.id).count() == 1)
            .count();
        assert!(
            nodes.len() == 6 && masters.len() == 3 && whole == 3,
            "node {p} sees {} nodes up, {} masters, {whole} with one replica, right after the cluster was ready: {nodes:?}",
            nodes.len(),
            masters.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zadd_wakes_an_idle_shard_on_every_master_also_after_a_failover() {
    let (_turn, c, f, mut conn) = serial_flow("wake", "shards = 3\nshard_names = \"spread\"\nscanners = 1\npoll_interval = \"30s\"\nwatchdog_interval = \"30s\"").await;
    let daemon = Daemon::start(&f.config);
    assert!(
        eventually(Duration::from_secs(15), || {
            let on = daemon.logs().contains("keyspace notifications on");
            async move { on }
        })
        .await,
        "notifications never on:\n{}",
        daemon.logs()
    );
    // Let every scanner make its first claim and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Three ZADDs a shard, each after its scanner went back to sleep: the
    // median says what a wake-up takes, not one scheduling hiccup of a busy
    // machine. Without a subscription it would take poll_interval (30 s).
    let mut round = 0;
    let mut probe = |conn: &mut redis::cluster_async::ClusterConnection| {
        round += 1;
        let r = round;
        let keys = f.keys.clone();
        let inbox = f.inbox.clone();
        let mut conn = conn.clone();
        async move {
            for (s, k) in keys.iter().enumerate() {
                let mut took = Vec::new();
                for i in 0..3 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let body = format!("wake-{r}-{s}-{i}");
                    let t0 = wall_ms();
                    let _: i64 = query(&mut conn, "ZADD", (k, 0, &body)).await;
                    let ok = eventually(Duration::from_secs(5), || {
                        let here = inbox.find(body.as_bytes()).is_some();
                        async move { here }
                    })
                    .await;
                    assert!(ok, "round {r}: shard {s} never delivered {body}");
                    took.push(inbox.find(body.as_bytes()).unwrap().at_ms - t0);
                }
                eprintln!("round {r}: shard {s} woke after {took:?} ms");
                took.sort();
                assert!(
                    took[1] <= 100,
                    "round {r}: shard {s} woke after {} ms (median of {took:?})",
                    took[1]
                );
            }
        }
    };
    probe(&mut conn).await;
    let master = c.master_of_slot(delayd::keys::slot(&f.keys[2])).await;
    let replica = c.replica_of(&master).await;
    let reply = cli(replica.port, &["CLUSTER", "FAILOVER"]);
    assert!(reply.contains("OK"), "{reply}");
    c.wait_ready();
    assert!(
        eventually(Duration::from_secs(10), || {
            let k = f.keys[2].clone();
            let port = replica.port;
            async move { c.master_of_slot(delayd::keys::slot(&k)).await.port == port }
        })
        .await,
        "the failover did not happen"
    );
    // The watcher re-reads the masters every second; then the new master's
    // subscription is in place and a ZADD there wakes its shard again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    probe(&mut conn).await;
    drop(daemon);
    for k in &f.keys {
        let _: i64 = query(&mut conn, "DEL", k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_a_live_shards_slot_mid_flow_loses_nothing() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    let nodes = c.nodes().await;
    let mut masters: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .collect();
    masters.sort_by_key(|n| n.port);
    let (from, to) = (masters[0], masters[1]);
    // reshard moves the source's lowest slots first: put the key there.
    let slot = from.slots.iter().map(|r| r.0).min().unwrap();
    let tag = (0u64..)
        .map(|n| format!("r{n}"))
        .find(|t| delayd::keys::slot(t) == slot)
        .unwrap();
    let mut b = BusinessSpec::random("reshard");
    b.key = format!("test:{{{tag}}}:{}", unique("k"));
    b.extra = "lease = \"3s\"\nbatch_size = 20".into();
    let f = flow_of(b).await;
    let mut conn = c.conn().await;
    f.schedule(&mut conn, 3000, Duration::from_secs(6)).await;
    let daemon = Daemon::start(&f.config);
    f.inbox.wait_for(500, Duration::from_secs(30)).await;
    let mut reshard = std::process::Command::new("redis-cli");
    reshard.args(["--cluster", "reshard", &format!("127.0.0.1:{}", from.port)]);
    reshard.args(["--cluster-from", &from.id, "--cluster-to", &to.id]);
    reshard.args(["--cluster-slots", "1", "--cluster-yes"]);
    output_ok(reshard, "reshard");
    // The target owns the slot once reshard returns; the other nodes learn
    // it by gossip, so a third node may still name the source.
    let owner = c
        .nodes_seen_by(&[to.port])
        .await
        .into_iter()
        .find(|n| n.master && n.slots.iter().any(|&(a, b)| slot >= a && slot <= b));
    assert_eq!(
        owner.map(|n| n.port),
        Some(to.port),
        "the slot did not move"
    );
    let seen = f.wait_all(3000, Duration::from_secs(60), &daemon).await;
    assert_eq!(seen.len(), 3000);
    f.assert_empty(&mut conn).await;
    assert!(!daemon.logs().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_rate_across_shards_on_every_master() {
    let (_turn, _c, f, mut conn) = serial_flow("rate", "shards = 3\nshard_names = \"spread\"\nscanners = 2\nbatch_size = 100\nmax_rate = 200\nmax_rate_scope = \"cluster\"").await;
    let per_shard = 1333;
    f.schedule(&mut conn, per_shard, Duration::ZERO).await;
    let d1 = Daemon::start(&f.config);
    let d2 = Daemon::start(&f.config);
    let seen = f.wait_all(per_shard, Duration::from_secs(60), &d1).await;
    f.inbox.settle(Duration::from_millis(500)).await;
    let total = 3 * per_shard;
    assert_eq!(seen.len(), total);
    let all = f.inbox.all();
    assert_eq!(all.len(), total, "a clean run delivers each member once");
    let first = all.iter().map(|r| r.at_ms).min().unwrap();
    let last = all.iter().map(|r| r.at_ms).max().unwrap();
    let seconds = (last - first) as f64 / 1000.0;
    // The budget starts full with one batch; the rest goes at 200/s.
    let expected = (total - 100) as f64 / 200.0;
    eprintln!("drained {total} over 3 shards in {seconds:.2} s (expected {expected:.1} s)");
    assert!(
        (expected * 0.9..=expected * 1.1).contains(&seconds),
        "two processes, max_rate = 200 shared, drained {total} in {seconds:.2} s; expected {expected:.1} s ± 10 %"
    );
    f.assert_empty(&mut conn).await;
    drop((d1, d2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_producer_in_the_docs_writes_to_the_shard_keys_delayd_reads() {
    let python = client("python");
    let c = cluster();
    let _turn = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let snippet = dir.path().join("producer.py");
    std::fs::write(&snippet, doc_block("redis-modes.md", "python")).unwrap();
    let mut conn = c.conn().await;
    for shards in [3usize, 16] {
        let key = unique("test:snippet");
        // The keys delayd reads for this business, from its own config.
        let config = dir.path().join(format!("shards-{shards}.toml"));
        std::fs::write(
            &config,
            format!(
                "{}[amqp]\nurl = \"amqp://127.0.0.1:1/%2f\"\n[http]\nlisten = \"off\"\n[businesses.b]\nkey = \"{key}\"\nexchange = \"x\"\nrouting_key = \"r\"\nshards = {shards}\nshard_names = \"spread\"\n",
                c.section()
            ),
        )
        .unwrap();
        let keys = delayd::config::load(&config).unwrap().businesses[0].keys();
        assert_eq!(keys.len(), shards);
        let before = redis_now_ms(&mut conn).await;
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(&snippet)
            .env("REDIS_URL", format!("redis://127.0.0.1:{}", c.ports()[0]))
            .env("DELAYD_KEY", &key)
            .env("DELAYD_SHARDS", shards.to_string());
        let out = tokio::task::spawn_blocking(move || output_ok(cmd, "producer.py"))
            .await
            .unwrap();
        let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(
            printed, keys,
            "the snippet's shard names for shards = {shards}"
        );
        let after = redis_now_ms(&mut conn).await;
        let body = r#"{"order":42,"action":"expire"}"#;
        let mut holders = Vec::new();
        for k in &keys {
            let score: Option<f64> = zscore(&mut conn, k, body).await;
            if let Some(due) = score {
                holders.push((k.clone(), due as i64));
            }
        }
        assert_eq!(
            holders.len(),
            1,
            "order-42 in {holders:?}, not in one shard"
        );
        let due = holders[0].1;
        assert!(
            (before + 25_000..=after + 35_000).contains(&due),
            "order-42 due {due}, not ~30 s after {before}"
        );
        for k in &keys {
            let _: i64 = query(&mut conn, "DEL", k).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_against_a_cluster_with_its_shard_comparison() {
    let _turn = SERIAL.lock().await;
    let c = cluster();
    let b = BusinessSpec::random("bench");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_redis(dir.path(), &c.section(), &amqp_url(), "off", &[&b]);
    let extra = [
        "--business",
        "shard_names = \"spread\"",
        "--compare-shards",
        "3",
    ];
    let (code, out, err) = short_bench(config.to_str().unwrap(), &extra);
    assert_eq!(code, 0, "bench failed on a cluster:\n{out}\n{err}");
    for row in [
        "delayd / ceiling",
        "3 shards / one key",
        "script calls per 1,000 members",
        "far-future writes at 2000/s",
    ] {
        assert!(out.contains(row), "no {row:?} in:\n{out}");
    }
}

/// A cluster node stopped with SIGSTOP, resumed when dropped.
struct Stalled(String);

impl Stalled {
    fn node(c: &Cluster, port: u16) -> Self {
        let pid = std::fs::read_to_string(c.dir.join(format!("{port}.pid")))
            .unwrap()
            .trim()
            .to_string();
        assert!(std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success());
        Stalled(pid)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_on_a_cluster_acknowledges_a_shards_messages_only_once_its_masters_replica_holds_them(
) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let _turn = SERIAL.lock().await;
    let c = cluster();
    c.wait_ready();
    let mut b = BusinessSpec::random("intake");
    let (exchange, queue) = (unique("intake-ex"), unique("intake-q"));
    b.extra = format!(
        "shards = 3\nshard_names = \"spread\"\nproperties = \"standard\"\n[businesses.intake.intake]\nexchange = \"{exchange}\"\nqueue = \"{queue}\"\n"
    );
    let consumers = Consumers::on(&amqp_url(), &[&b]).await;
    let config = write_config_redis(
        consumers.dir.path(),
        &c.section(),
        &amqp_url(),
        "127.0.0.1:0",
        &[&b],
    );
    let keys = delayd::config::load(&config).unwrap().businesses[0].keys();
    let daemon = Daemon::start(&config);
    let amqp = amqp_at(&amqp_url()).await;
    wait_consumed_queue(&amqp, &queue, &daemon).await;
    let port = daemon.metrics_port().await;
    let acked = move || async move {
        metric(port, "delayd_intake_stored_total{business=\"intake\"}")
            .await
            .unwrap_or(0)
    };

    let ids: Vec<String> = (0..150).map(|i| format!("c-{i}")).collect();
    let on_first = ids
        .iter()
        .filter(|id| delayd::tasks::shard_of(&keys, id.as_bytes()) == keys[0])
        .count() as u64;
    assert!(on_first > 0 && on_first < ids.len() as u64);
    let master = c.master_of_slot(delayd::keys::slot(&keys[0])).await;
    let replica = c.replica_of(&master).await;
    let stalled = Stalled::node(c, replica.port);
    let ch = amqp.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for id in &ids {
        let mut h = lapin::types::FieldTable::default();
        h.insert(
            "x-delay".into(),
            lapin::types::AMQPValue::LongInt(3_600_000),
        );
        let props = lapin::BasicProperties::default()
            .with_headers(h)
            .with_message_id(id.as_str().into());
        let confirm = ch
            .basic_publish(
                exchange.as_str().into(),
                "rk".into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                props,
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
    }
    let said = eventually(Duration::from_secs(20), || async {
        daemon
            .logs()
            .contains("not acknowledged until enough replicas hold them")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let while_stalled = acked().await;
    drop(stalled);
    assert!(
        said,
        "no line says why the intake waits:\n{}",
        daemon.logs()
    );
    assert!(
        while_stalled <= ids.len() as u64 - on_first,
        "{while_stalled} acknowledged while the replica of the first shard's master was stopped: more than the {} on the other shards",
        ids.len() as u64 - on_first
    );
    let all = eventually(Duration::from_secs(30), || async {
        acked().await >= ids.len() as u64
    })
    .await;
    assert!(
        all,
        "only {} of {} acknowledged after the replica came back:\n{}",
        acked().await,
        ids.len(),
        daemon.logs()
    );
    let mut conn = c.conn().await;
    let mut stored = 0u64;
    for k in &keys {
        stored += zcard(&mut conn, k).await;
    }
    assert_eq!(
        stored,
        ids.len() as u64,
        "not every acknowledged message is pending"
    );
    drop(daemon);
    for k in &keys {
        for key in family(k).all() {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap_or(0);
        }
    }
    let admin = amqp.create_channel().await.unwrap();
    let _ = admin
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    let _ = admin
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await;
}
