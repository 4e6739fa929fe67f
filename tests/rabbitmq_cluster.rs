//! A three-node RabbitMQ cluster on this machine (`rabbitmq-cluster.sh`),
//! started once for this test binary and killed by its watchers when the
//! binary exits, with a quorum queue bound to the business's exchange.
//! delayd gets the node list; nodes are killed and stopped under it.
//! The tests take turns: each leaves the cluster whole again.

use delayd_test_support as common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use lapin::types::{AMQPValue, FieldTable, LongString};

struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("delayd-cluster-{}", std::process::id()));
        let ports: Vec<u16> = (0..3).map(|_| rabbit_port()).collect();
        let mut args = vec!["start".to_string(), dir.display().to_string()];
        args.extend(ports.iter().map(|p| p.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_script(
            "rabbitmq-cluster.sh",
            &args,
            &[
                ("DELAYD_RABBITMQ_WATCH_PID", std::process::id().to_string()),
                ("DELAYD_START_TIMEOUT", "180".into()),
            ],
        );
        Cluster { dir, ports }
    })
}

/// One test at a time: they kill and stop the shared cluster's nodes.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The cluster, all three nodes up, for this test alone while it holds the
/// guard.
async fn whole_cluster() -> (&'static Cluster, tokio::sync::MutexGuard<'static, ()>) {
    let c = cluster();
    let turn = TURN.lock().await;
    c.make_whole().await;
    (c, turn)
}

impl Cluster {
    fn url(&self, port: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
    }

    /// A config in `dir` for `b` that gives delayd the nodes on `ports`.
    fn config(&self, dir: &std::path::Path, ports: &[u16], b: &BusinessSpec) -> PathBuf {
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("\"{}\"", self.url(*p)))
            .collect();
        write_config_with(
            dir,
            &redis_url(),
            &format!("urls = [{}]\nconnect_timeout = \"3s\"", urls.join(", ")),
            "off",
            &[b],
        )
    }

    /// `rabbitmq-node.sh CMD` for the node on `port`, off the async threads.
    async fn node(&self, cmd: &str, port: u16, extra: &[&str]) -> String {
        let dir = self.dir.join(format!("node-{port}")).display().to_string();
        let cookie = std::fs::read_to_string(self.dir.join("cookie")).unwrap();
        let mut args = vec![cmd.to_string(), dir, port.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_script(
                "rabbitmq-node.sh",
                &args,
                &[
                    ("DELAYD_RABBITMQ_DIST_PORT", (port - 10000).to_string()),
                    ("DELAYD_RABBITMQ_COOKIE", cookie),
                    ("DELAYD_RABBITMQ_WATCH_PID", std::process::id().to_string()),
                    ("DELAYD_START_TIMEOUT", "180".into()),
                ],
            )
        })
        .await
        .unwrap()
    }

    /// Starts any node a failed test left down (a no-op for running nodes).
    async fn make_whole(&self) {
        for p in self.ports.clone() {
            self.node("start", p, &[]).await;
        }
    }

    /// The node (AMQP port) that leads quorum queue `queue`, asked of `via`.
    async fn leader(&self, queue: &str, via: u16) -> u16 {
        let out = self
            .node(
                "ctl",
                via,
                &["-q", "list_queues", "name", "leader", "--no-table-headers"],
            )
            .await;
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(queue))
            .unwrap_or_else(|| panic!("queue {queue} not listed: {out}"));
        let node = line.split_whitespace().nth(1).unwrap_or("");
        node.trim_start_matches("delayd-test-")
            .split('@')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no leader in {line:?}"))
    }
}

/// The AMQP port of the node delayd last logged connecting to.
fn connected_port(d: &Daemon) -> Option<u16> {
    let logs = d.logs();
    let line = logs
        .lines()
        .rev()
        .find(|l| l.contains("connected to RabbitMQ"))?;
    let rest = &line[line.find("127.0.0.1:")? + "127.0.0.1:".len()..];
    rest.chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

/// A quorum queue bound to the business's exchange, declared through `via`.
async fn quorum_queue(via: &str, b: &BusinessSpec) -> String {
    let queue = unique("qq");
    let conn = amqp_at(via).await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    declare_with(&ch, &b.exchange, &queue, &b.routing_key, args).await;
    let _ = conn.close(200, "ok".into()).await;
    queue
}

/// `n` members due over the next `spread_ms`, starting in 500 ms.
async fn schedule_flow(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
    tag: &str,
    n: usize,
    spread_ms: i64,
) -> HashSet<Vec<u8>> {
    let now = redis_now_ms(redis).await;
    let items: Vec<(f64, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                (now + 500 + i as i64 * spread_ms / n as i64) as f64,
                format!("{tag}-{i}").into_bytes(),
            )
        })
        .collect();
    zadd_many(redis, key, &items).await;
    items.into_iter().map(|(_, m)| m).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_connected_node_loses_nothing_and_delivery_resumes_within_10s() {
    let (c, _turn) = whole_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("cluster_kill");
    let config = c.config(dir.path(), &c.ports, &b);
    let mut d = Daemon::start(&config);
    let ok = eventually(Duration::from_secs(20), || async {
        connected_port(&d).is_some()
    })
    .await;
    assert!(ok, "delayd did not connect; log:\n{}", d.tail());
    let victim = connected_port(&d).unwrap();
    // Declared through the node delayd is on, which then leads the queue
    // (client-local placement): the kill takes delayd's connection and the
    // queue's leader at once, the hardest case.
    let queue = quorum_queue(&c.url(victim), &b).await;
    assert_eq!(c.leader(&queue, victim).await, victim, "the queue's leader");
    // The consumer stays on a node that survives and acknowledges what it recorded.
    let survivor = *c.ports.iter().find(|p| **p != victim).unwrap();
    let consumer = amqp_at(&c.url(survivor)).await;
    let inbox = Inbox::default();
    consume_into(&consumer, &queue, &inbox, true).await;

    let mut redis = redis().await;
    let n = 3000;
    let mut want = schedule_flow(&mut redis, &b.key, "ck", n, 6000).await;
    inbox.wait_for(n / 5, Duration::from_secs(30)).await;
    c.node("kill", victim, &[]).await;
    let killed = wall_ms();
    // Due only after the kill: these go out through another node.
    let now = redis_now_ms(&mut redis).await;
    let late: Vec<(f64, Vec<u8>)> = (0..200)
        .map(|i| (now as f64, format!("ck-late-{i}").into_bytes()))
        .collect();
    zadd_many(&mut redis, &b.key, &late).await;
    want.extend(late.into_iter().map(|(_, m)| m));

    wait_all(&inbox, &want, Duration::from_secs(90), &d).await;
    let first_after = inbox
        .all()
        .iter()
        .filter(|r| r.body.starts_with(b"ck-late-"))
        .map(|r| r.at_ms)
        .min()
        .unwrap();
    eprintln!(
        "delivery resumed {} ms after the kill",
        first_after - killed
    );
    assert!(
        first_after - killed < 10_000,
        "delivery resumed {} ms after the kill; log:\n{}",
        first_after - killed,
        d.tail()
    );
    let now_on = connected_port(&d).unwrap();
    assert_ne!(now_on, victim, "delayd should be on another node");
    wait_drained(&mut redis, &b.key, Duration::from_secs(30)).await;
    assert_eq!(
        zcard(&mut redis, &family(&b.key).dead).await,
        0,
        "nothing dead-lettered"
    );
    assert!(d.child.try_wait().unwrap().is_none(), "delayd exited");
    d.kill();
    drop(consumer);
    c.node("start", victim, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_quorum_leader_stalls_confirms_then_they_resume_and_nothing_is_dead() {
    let (c, _turn) = whole_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let b = BusinessSpec::random("cluster_leader");
    let queue = quorum_queue(&c.url(c.ports[0]), &b).await;
    let leader = c.leader(&queue, c.ports[0]).await;
    // delayd and the consumer use the followers only: what stops is the
    // queue's leader, not delayd's connection.
    let followers: Vec<u16> = c.ports.iter().copied().filter(|p| *p != leader).collect();
    let config = c.config(dir.path(), &followers, &b);
    let consumer = amqp_at(&c.url(followers[0])).await;
    let inbox = Inbox::default();
    consume_into(&consumer, &queue, &inbox, true).await;
    let mut d = Daemon::start(&config);

    let mut redis = redis().await;
    let n = 3000;
    let want = schedule_flow(&mut redis, &b.key, "cl", n, 6000).await;
    inbox.wait_for(n / 5, Duration::from_secs(30)).await;
    c.node("stop", leader, &[]).await;
    let stopped = wall_ms();
    let new_leader = c.leader(&queue, followers[0]).await;
    eprintln!("leader {leader} stopped; new leader {new_leader}");

    wait_all(&inbox, &want, Duration::from_secs(120), &d).await;
    let last = inbox.all().iter().map(|r| r.at_ms).max().unwrap();
    eprintln!(
        "all delivered {} ms after the leader stopped",
        last - stopped
    );
    wait_drained(&mut redis, &b.key, Duration::from_secs(30)).await;
    assert_eq!(
        zcard(&mut redis, &family(&b.key).dead).await,
        0,
        "members were dead-lettered; log:\n{}",
        d.tail()
    );
    assert!(d.child.try_wait().unwrap().is_none(), "delayd exited");
    d.kill();
    drop(consumer);
    c.node("start", leader, &[]).await;
}
