//! `delayd check`: the file, then Redis (its masters' notification and
//! eviction settings), every RabbitMQ node, and per business its keys,
//! unread keys, exchange, intake and (on a cluster) shard placement. One
//! line per item; any FAILED line makes the exit code 1.

use lapin::Connection;

use super::{redis_and_conn, Failure};
use crate::config::{Business, Config, RedisMode};
use crate::redis_conn::{Master, Redis, RedisConn};

/// What the server checks found, for the per-business checks.
struct Servers {
    redis: Option<RedisConn>,
    masters: Vec<Master>,
    amqp: Option<Connection>,
}

/// Runs every check and prints its line; `Err` when any failed.
pub(super) async fn run(cfg: &Config) -> Result<(), Failure> {
    println!(
        "config    {}: ok, {} businesses",
        cfg.path.display(),
        cfg.businesses.len()
    );
    println!(
        "wire      format {}: reads what docs/wire-format.md version {0} and earlier describe",
        crate::message::WIRE_FORMAT
    );
    let mut failed = false;
    let (redis, masters) = match redis_and_conn(cfg).await {
        Ok((redis, conn)) => {
            let masters = redis_servers(cfg, &redis, &conn).await;
            (Some(conn), masters)
        }
        Err(f) => {
            println!("redis     {}: FAILED: {}", cfg.redis.describe(), f.message);
            failed = true;
            (None, Vec::new())
        }
    };
    let (amqp, amqp_failed) = amqp_nodes(cfg).await;
    failed |= amqp_failed;
    let servers = Servers {
        redis,
        masters,
        amqp,
    };
    for b in &cfg.businesses {
        failed |= business(cfg, b, &servers).await;
    }
    if let Some(c) = servers.amqp {
        let _ = c.close(200, "check done".into()).await;
    }
    if failed {
        Err(Failure::runtime("check failed; see the lines above"))
    } else {
        Ok(())
    }
}

/// Prints Redis's line (mode, masters, keyspace notifications) and an
/// eviction warning per master; returns the masters.
async fn redis_servers(cfg: &Config, redis: &Redis, conn: &RedisConn) -> Vec<Master> {
    let found = conn.masters(redis).await.unwrap_or_default();
    let mut notes = Vec::new();
    for m in &found {
        match master_flags(conn, redis, m).await.as_deref() {
            Some(f) if crate::store::flags_notify_zsets(f) => {}
            Some(f) => notes.push(format!("{} has \"{f}\"", m.addr)),
            None => notes.push(format!("{} unknown (CONFIG not allowed)", m.addr)),
        }
    }
    let mode = if !found.is_empty() && notes.is_empty() {
        "keyspace notifications on (millisecond wake-ups)".to_string()
    } else {
        format!(
            "keyspace notifications off or unknown ({}): idle scanners poll every poll_interval; CONFIG SET notify-keyspace-events Kz turns them on",
            notes.join(", ")
        )
    };
    let topology = if cfg.redis.mode == RedisMode::Cluster {
        format!(", {} masters", found.len())
    } else {
        String::new()
    };
    println!("redis     {}: ok{topology}, {mode}", cfg.redis.describe());
    found
}

/// One master's `notify-keyspace-events`, `None` where CONFIG is refused;
/// prints a warning when its eviction policy may evict delayd's keys.
async fn master_flags(conn: &RedisConn, redis: &Redis, m: &Master) -> Option<String> {
    let client = conn.subscriber(redis, m).ok()?;
    let mut n = tokio::time::timeout(
        crate::redis_conn::CONNECT_TIMEOUT,
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    if let Some(risk) = crate::store::eviction_risk(&mut n).await {
        println!("redis     {}: WARNING: {risk}", m.addr);
    }
    crate::store::keyspace_flags(&mut n).await
}

/// Connects to every node: one delayd would fail over to with a bad
/// certificate or password is found before it is needed. Returns the first
/// connection that worked, and whether any failed.
async fn amqp_nodes(cfg: &Config) -> (Option<Connection>, bool) {
    let nodes = match crate::amqp::Nodes::new(&cfg.amqp) {
        Ok(nodes) => nodes,
        Err(e) => {
            println!("amqp      {}: FAILED: {e}", cfg.amqp);
            return (None, true);
        }
    };
    let mut first = None;
    let mut failed = false;
    for i in 0..nodes.len() {
        match nodes.connect(i, "delayd check", false).await {
            Ok(c) => {
                println!("amqp      {}: ok", nodes.name(i));
                first.get_or_insert(c);
            }
            Err(e) => {
                println!("amqp      FAILED: {e}");
                failed = true;
            }
        }
    }
    (first, failed)
}

/// One business's lines; true when any check failed.
async fn business(cfg: &Config, b: &Business, s: &Servers) -> bool {
    let mut notes = Vec::new();
    if let Some(conn) = &s.redis {
        key_types(conn, b, &mut notes).await;
        unread_keys(conn, b, &mut notes).await;
        match crate::intake::waitaof::refusal(conn, b).await {
            Ok(None) => {}
            Ok(Some(line)) => notes.push(line),
            Err(e) => notes.push(format!("cannot ask Redis whether it has WAITAOF: {e}")),
        }
    }
    if let Some(conn) = &s.amqp {
        if let Err(e) = crate::amqp::exchange_exists(conn, &b.exchange).await {
            notes.push(format!(
                "exchange \"{}\" is not usable ({e}): declare it on the broker or fix the name",
                b.exchange
            ));
        }
    }
    let mut failed = !notes.is_empty();
    if notes.is_empty() && s.redis.is_some() && s.amqp.is_some() {
        println!(
            "business  {}: ok, key \"{}\"{} -> exchange \"{}\", routing key \"{}\"",
            b.name,
            b.key,
            if b.shards > 1 {
                format!(" ({} shards)", b.shards)
            } else {
                String::new()
            },
            b.exchange,
            b.routing_key
        );
    } else if notes.is_empty() {
        println!(
            "business  {}: not checked (a server is unreachable)",
            b.name
        );
    } else {
        println!("business  {}: FAILED: {}", b.name, notes.join("; "));
    }
    if let (Some(intake), Some(conn)) = (&b.intake, &s.amqp) {
        match crate::intake::topology::check(conn, intake).await {
            Ok(summary) => println!("intake    {}: ok, {summary}", b.name),
            Err(e) => {
                failed = true;
                println!("intake    {}: FAILED: {e}", b.name);
            }
        }
    }
    if cfg.redis.mode == RedisMode::Cluster && s.redis.is_some() && notes.is_empty() {
        print_placement(b, &s.masters);
    }
    failed
}

/// Each key must be a sorted set (or absent): producers `ZADD` to it.
async fn key_types(conn: &RedisConn, b: &Business, notes: &mut Vec<String>) {
    for k in b.keys() {
        let mut c = conn.clone();
        match redis::cmd("TYPE")
            .arg(&k)
            .query_async::<String>(&mut c)
            .await
        {
            Ok(t) if t == "zset" || t == "none" => {}
            Ok(t) => notes.push(format!(
                "key \"{k}\" is a {t}, not a sorted set: producers must ZADD to it"
            )),
            Err(e) => notes.push(format!("key \"{k}\": {e}")),
        }
    }
}

/// Members waiting under names this business does not read: a failure,
/// or a warning with `ignore_unread_keys`.
async fn unread_keys(conn: &RedisConn, b: &Business, notes: &mut Vec<String>) {
    match crate::unread::find(conn, b).await {
        Ok(found) if found.is_empty() => {}
        Ok(found) if b.ignore_unread_keys => println!(
            "business  {}: WARNING: {}",
            b.name,
            crate::unread::describe(b, &found)
        ),
        Ok(found) => notes.push(crate::unread::describe(b, &found)),
        Err(e) => notes.push(format!("cannot look for unread keys: {e}")),
    }
}

/// On a cluster: which master serves each shard, warnings when the shards
/// do not spread, and a note recommending `"spread"` names.
fn print_placement(b: &Business, masters: &[Master]) {
    let (lines, warnings) = placement(b, masters);
    for l in lines {
        println!("          {l}");
    }
    for w in warnings {
        println!("business  {}: WARNING: {w}", b.name);
    }
    if b.shards > 1 && b.shard_names == crate::keys::ShardNames::Index {
        println!(
            "business  {}: note: on a cluster, shard_names = \"spread\" gives each shard its own slot range, so the shards spread over the masters (producers then write the names `delayd shards {}` prints)",
            b.name, b.name
        );
    }
}

/// For a cluster: which master serves each shard, and a warning when the
/// shards do not spread (a master with none, or one with most of them).
fn placement(b: &Business, masters: &[Master]) -> (Vec<String>, Vec<String>) {
    let keys = b.keys();
    let mut lines = Vec::new();
    let mut per_master = vec![0usize; masters.len()];
    for (i, k) in keys.iter().enumerate() {
        let slot = crate::keys::slot(k);
        let owner = masters.iter().position(|m| m.serves(slot));
        if let Some(o) = owner {
            per_master[o] += 1;
        }
        lines.push(format!(
            "shard {i} \"{k}\" -> slot {slot} -> {}",
            owner
                .map(|o| masters[o].addr.to_string())
                .unwrap_or_else(|| "no master (slot not served)".into())
        ));
    }
    let mut warnings = Vec::new();
    if keys.len() > 1 && masters.len() > 1 {
        let idle: Vec<String> = masters
            .iter()
            .zip(&per_master)
            .filter(|(_, n)| **n == 0)
            .map(|(m, _)| m.addr.to_string())
            .collect();
        if !idle.is_empty() && keys.len() >= masters.len() {
            warnings.push(format!(
                "master(s) {} hold no shard of this business; with shard_names = \"spread\" and shards a multiple of the masters each gets its share",
                idle.join(", ")
            ));
        }
        for (m, n) in masters.iter().zip(&per_master) {
            if *n * 2 > keys.len() {
                warnings.push(format!(
                    "master {} holds {n} of {} shards",
                    m.addr,
                    keys.len()
                ));
            }
        }
    }
    (lines, warnings)
}
