//! The Redis and delayd processes whose CPU time a drain is charged with.

use super::*;

/// The processes whose CPU time a drain is charged with.
pub(super) struct CpuWatch {
    /// The local redis-server processes (masters and replicas).
    pub(super) redis: Vec<RedisProcess>,
    /// delayd's own process.
    pub(super) daemon: u32,
}

/// A redis-server process on this machine that serves the bench.
pub(super) struct RedisProcess {
    pub(super) pid: u32,
    pub(super) replica: bool,
}

/// The local redis-server processes behind the connection: every master (a
/// cluster's all, else the one server) and their replicas, found by the
/// `process_id` each reports. A pid counts only if /proc shows a
/// redis-server listening on the node's port, so servers on other machines
/// are left out (and the CPU row then says unknown).
pub(super) async fn redis_processes(redis: &Redis, conn: &RedisConn) -> Vec<RedisProcess> {
    let Ok(masters) = conn.masters(redis).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for m in &masters {
        let Ok(client) = conn.subscriber(redis, m) else {
            continue;
        };
        let Some((pid, replicas)) = node_info(&client).await else {
            continue;
        };
        if let Some(pid) = pid {
            out.push(RedisProcess {
                pid,
                replica: false,
            });
        }
        for addr in replicas {
            let Ok(client) = redis.node_client(&addr) else {
                continue;
            };
            if let Some((Some(pid), _)) = node_info(&client).await {
                out.push(RedisProcess { pid, replica: true });
            }
        }
    }
    out
}

/// A node's local pid (when /proc confirms it) and its replicas' addresses.
pub(super) async fn node_info(
    client: &redis::Client,
) -> Option<(Option<u32>, Vec<crate::redis_conn::Addr>)> {
    let mut c = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .ok()?;
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .ok()?;
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let pid = field(&server, "process_id:").and_then(|v| v.parse::<u32>().ok());
    let port = field(&server, "tcp_port:").unwrap_or_default();
    // Redis titles its process "redis-server <addr>:<port> ...".
    let local = pid.filter(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.starts_with("redis-server") && cmdline.contains(&format!(":{port}"))
    });
    // slave0:ip=127.0.0.1,port=31003,state=online,offset=...,lag=0
    let replicas = replication
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("ip="))
        .filter_map(|l| {
            let kv = |k: &str| {
                l.split([':', ','])
                    .find_map(|p| p.strip_prefix(k))
                    .map(str::to_string)
            };
            Some(crate::redis_conn::Addr {
                host: kv("ip=")?,
                port: kv("port=")?.parse().ok()?,
            })
        })
        .collect();
    Some((local, replicas))
}

/// User plus system CPU ticks so far of one process (0 if it is gone).
pub(super) fn proc_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that ends the command name: state is the 3rd
    // field of the line, utime the 14th and stime the 15th.
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// User plus system CPU ticks so far of the masters and of the replicas.
pub(super) fn cpu_ticks(procs: &[RedisProcess]) -> (u64, u64) {
    let mut sum = (0u64, 0u64);
    for p in procs {
        let ticks = proc_ticks(p.pid);
        if p.replica {
            sum.1 += ticks;
        } else {
            sum.0 += ticks;
        }
    }
    sum
}
