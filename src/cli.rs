//! The `delayd` commands and their exit codes: 0 success, 1 a runtime
//! failure (a server unreachable, a check failed), 2 a usage or config error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, Business, Config, RedisMode};
use crate::redis_conn::{Master, Redis, RedisConn};
use crate::store::{KeyFamily, Store, Totals};

mod by_id;
mod recurring;

/// Command-line interface of `delayd`.
#[derive(Debug, Parser)]
#[command(
    name = "delayd",
    version,
    about = "A reliable delay queue: Redis sorted sets in, RabbitMQ out"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct ConfigArg {
    /// The TOML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon until SIGTERM or SIGINT.
    Run(ConfigArg),
    /// Validate the file, connect to both servers and check every exchange.
    Check(ConfigArg),
    /// Show pending, due, in-flight and dead counts per business.
    Inspect {
        #[command(flatten)]
        config: ConfigArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Schedule one task (for operators and demos).
    Schedule(by_id::ScheduleArgs),
    /// Show where one task is: pending, in flight, dead or not found (exit 4).
    Get(by_id::MemberArgs),
    /// Cancel one pending task (exit 3 if in flight, 4 if not pending).
    Cancel(by_id::MemberArgs),
    /// Move one pending task to a new due time (exit 3 if in flight, 4 if not pending).
    Reschedule(by_id::RescheduleArgs),
    /// Page through pending tasks in due order.
    List(by_id::ListArgs),
    /// Print the keys producers write to for a business, one per line
    /// (shard 0 first), with each key's cluster slot.
    Shards {
        #[command(flatten)]
        config: ConfigArg,
        /// The business whose keys to print.
        business: String,
    },
    /// Print each recurring schedule's next occurrences.
    Recurring(recurring::RecurringArgs),
    /// Look at and act on dead members.
    Dead {
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Measure the broker's ceiling, delayd's drain rate, lateness and idle cost.
    Bench(crate::bench::BenchArgs),
}

#[derive(Debug, Subcommand)]
enum DeadAction {
    /// List dead members, oldest first, with their reason and age.
    List(DeadArgs),
    /// Move dead members back to pending, due now, attempts reset.
    Requeue(DeadActArgs),
    /// Delete dead members.
    Purge(DeadActArgs),
}

/// Which dead members `requeue` and `purge` act on: all (oldest first) by
/// default.
#[derive(Debug, Args)]
struct DeadActArgs {
    #[command(flatten)]
    dead: DeadArgs,
    /// Only this member (the id in id mode, the body in body mode).
    #[arg(long, conflicts_with = "reason")]
    member: Option<String>,
    /// Only the members whose reason contains this text.
    #[arg(long)]
    reason: Option<String>,
    /// Print how many members would be acted on, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl DeadActArgs {
    fn filter(&self) -> crate::tasks::dead::Filter {
        use crate::tasks::dead::Filter;
        match (&self.member, &self.reason) {
            (Some(m), _) => Filter::Member(m.as_bytes().to_vec()),
            (None, Some(r)) => Filter::Reason(r.clone()),
            (None, None) => Filter::All,
        }
    }
}

#[derive(Debug, Args)]
struct DeadArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business whose dead set to use.
    business: String,
    /// At most this many members (list defaults to 100, requeue and purge to all).
    #[arg(long)]
    limit: Option<usize>,
}

/// A command's failure, with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// A usage or config error (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    /// A runtime failure (exit code 1).
    pub fn runtime(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }

    /// An outcome the command has already reported, told by its exit code
    /// alone (e.g. 3: the task is in flight).
    pub fn status(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
        }
    }
}

impl From<config::ConfigError> for Failure {
    fn from(e: config::ConfigError) -> Self {
        Failure::usage(e.to_string())
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(e: crate::store::StoreError) -> Self {
        Failure::runtime(format!("redis: {e}"))
    }
}

/// Runs a parsed command line and returns the process exit code.
pub fn main(cli: Cli) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("delayd: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("delayd: error: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}

async fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Run(c) => {
            let cfg = config::load(&c.config)?;
            crate::telemetry::init_logging(cfg.log_format, &cfg.log_level);
            crate::supervisor::run(cfg).await.map_err(|e| match e {
                crate::supervisor::RunError::Amqp(_)
                | crate::supervisor::RunError::Redis(_)
                | crate::supervisor::RunError::UnreadKeys(_) => Failure::usage(e.to_string()),
                other => Failure::runtime(other.to_string()),
            })
        }
        Command::Check(c) => check(&config::load(&c.config)?).await,
        Command::Inspect { config: c, json } => inspect(&config::load(&c.config)?, json).await,
        Command::Schedule(a) => by_id::schedule(a).await,
        Command::Get(a) => by_id::get(a).await,
        Command::Cancel(a) => by_id::cancel(a).await,
        Command::Reschedule(a) => by_id::reschedule(a).await,
        Command::List(a) => by_id::list(a).await,
        Command::Shards {
            config: c,
            business,
        } => shards(&config::load(&c.config)?, &business),
        Command::Dead { action } => dead(action).await,
        Command::Recurring(a) => recurring::recurring(a),
        Command::Bench(args) => crate::bench::run(args).await.map_err(|e| Failure {
            code: e.exit_code(),
            message: e.to_string(),
        }),
    }
}

/// Connects to Redis once, with a bounded wait, for the one-shot commands.
async fn redis_conn(cfg: &Config) -> Result<RedisConn, Failure> {
    Ok(redis_and_conn(cfg).await?.1)
}

/// [`redis_conn`], with the settings it was made from (for per-node clients).
async fn redis_and_conn(cfg: &Config) -> Result<(Redis, RedisConn), Failure> {
    let redis = Redis::new(&cfg.redis).map_err(|e| Failure::usage(e.to_string()))?;
    match redis.connect().await {
        Ok(c) => Ok((redis, c)),
        Err(e) => Err(Failure::runtime(format!("cannot reach Redis: {e}"))),
    }
}

fn stores(conn: &RedisConn, b: &Business) -> Vec<Store> {
    b.keys()
        .iter()
        .map(|k| Store::new(conn.clone(), KeyFamily::new(k), b.score_unit).with_member(b.member))
        .collect()
}

fn shards(cfg: &Config, business: &str) -> Result<(), Failure> {
    let b = cfg.business(business).map_err(Failure::usage)?;
    for k in b.keys() {
        println!("{k}\t{}", crate::keys::slot(&k));
    }
    Ok(())
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

async fn check(cfg: &Config) -> Result<(), Failure> {
    let mut failed = false;
    println!(
        "config    {}: ok, {} businesses",
        cfg.path.display(),
        cfg.businesses.len()
    );
    let mut masters: Vec<Master> = Vec::new();
    let redis = match redis_and_conn(cfg).await {
        Ok((redis, c)) => {
            let found = c.masters(&redis).await.unwrap_or_default();
            let mut notes = Vec::new();
            let mut all_on = !found.is_empty();
            for m in &found {
                let flags = match c.subscriber(&redis, m) {
                    Ok(client) => match tokio::time::timeout(
                        crate::redis_conn::CONNECT_TIMEOUT,
                        client.get_multiplexed_async_connection(),
                    )
                    .await
                    {
                        Ok(Ok(mut n)) => {
                            if let Some(risk) = crate::store::eviction_risk(&mut n).await {
                                println!("redis     {}: WARNING: {risk}", m.addr);
                            }
                            crate::store::keyspace_flags(&mut n).await
                        }
                        _ => None,
                    },
                    Err(_) => None,
                };
                match flags.as_deref() {
                    Some(f) if crate::store::flags_notify_zsets(f) => {}
                    Some(f) => {
                        all_on = false;
                        notes.push(format!("{} has \"{f}\"", m.addr));
                    }
                    None => {
                        all_on = false;
                        notes.push(format!("{} unknown (CONFIG not allowed)", m.addr));
                    }
                }
            }
            let mode = if all_on {
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
            masters = found;
            Some(c)
        }
        Err(f) => {
            println!("redis     {}: FAILED: {}", cfg.redis.describe(), f.message);
            failed = true;
            None
        }
    };
    // Every node is tried: a cluster node that cannot be reached, or that
    // refuses delayd's certificate, fails when delayd fails over to it.
    let mut amqp = None;
    match crate::amqp::Nodes::new(&cfg.amqp) {
        Ok(nodes) => {
            for i in 0..nodes.len() {
                match nodes.connect(i, "delayd check", None).await {
                    Ok(c) => {
                        println!("amqp      {}: ok", nodes.name(i));
                        amqp.get_or_insert(c);
                    }
                    Err(e) => {
                        println!("amqp      FAILED: {e}");
                        failed = true;
                    }
                }
            }
        }
        Err(e) => {
            println!("amqp      {}: FAILED: {e}", cfg.amqp);
            failed = true;
        }
    }
    for b in &cfg.businesses {
        let mut notes = Vec::new();
        if let Some(conn) = &redis {
            for k in b.keys() {
                let mut c = conn.clone();
                match redis::cmd("TYPE")
                    .arg(&k)
                    .query_async::<String>(&mut c)
                    .await
                {
                    Ok(t) if t == "zset" || t == "none" => {}
                    Ok(t) => {
                        failed = true;
                        notes.push(format!(
                            "key \"{k}\" is a {t}, not a sorted set: producers must ZADD to it"
                        ));
                    }
                    Err(e) => {
                        failed = true;
                        notes.push(format!("key \"{k}\": {e}"));
                    }
                }
            }
        }
        if let Some(conn) = &redis {
            match crate::unread::find(conn, b).await {
                Ok(found) if found.is_empty() => {}
                Ok(found) if b.ignore_unread_keys => {
                    println!(
                        "business  {}: WARNING: {}",
                        b.name,
                        crate::unread::describe(b, &found)
                    );
                }
                Ok(found) => {
                    failed = true;
                    notes.push(crate::unread::describe(b, &found));
                }
                Err(e) => {
                    failed = true;
                    notes.push(format!("cannot look for unread keys: {e}"));
                }
            }
        }
        if let Some(conn) = &amqp {
            match crate::amqp::exchange_exists(conn, &b.exchange).await {
                Ok(()) => {}
                Err(e) => {
                    failed = true;
                    notes.push(format!(
                        "exchange \"{}\" is not usable ({e}): declare it on the broker or fix the name",
                        b.exchange
                    ));
                }
            }
        }
        if notes.is_empty() && redis.is_some() && amqp.is_some() {
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
        if let (Some(intake), Some(conn)) = (&b.intake, &amqp) {
            match crate::intake::topology::check(conn, intake).await {
                Ok(summary) => println!("intake    {}: ok, {summary}", b.name),
                Err(e) => {
                    failed = true;
                    println!("intake    {}: FAILED: {e}", b.name);
                }
            }
        }
        if cfg.redis.mode == RedisMode::Cluster && redis.is_some() && notes.is_empty() {
            let (lines, warnings) = placement(b, &masters);
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
    }
    if let Some(c) = amqp {
        let _ = c.close(200, "check done".into()).await;
    }
    if failed {
        Err(Failure::runtime("check failed; see the lines above"))
    } else {
        Ok(())
    }
}

fn human_ms(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms > 100 * 365 * 86_400_000 => "far future".into(),
        Some(ms) => humantime::format_duration(Duration::from_millis(ms as u64)).to_string(),
    }
}

async fn inspect(cfg: &Config, json: bool) -> Result<(), Failure> {
    let conn = redis_conn(cfg).await?;
    let mut rows = Vec::new();
    for b in &cfg.businesses {
        let mut all = Vec::new();
        for s in stores(&conn, b) {
            all.push(
                s.stats()
                    .await
                    .map_err(|e| Failure::runtime(format!("business \"{}\": {e}", b.name)))?,
            );
        }
        rows.push(Totals::of(&b.name, &all));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{:<24} {:>10} {:>10} {:>16} {:>16} {:>10} {:>8}",
        "business", "pending", "due now", "oldest overdue", "next due in", "in flight", "dead"
    );
    for r in rows {
        println!(
            "{:<24} {:>10} {:>10} {:>16} {:>16} {:>10} {:>8}",
            r.business,
            r.pending,
            r.due_now,
            human_ms(r.oldest_overdue_ms),
            human_ms(r.next_due_in_ms),
            r.in_flight,
            r.dead
        );
    }
    Ok(())
}

/// Parses `--at`: epoch milliseconds or an RFC 3339 time.
fn parse_at(s: &str) -> Result<i64, Failure> {
    crate::tasks::when::parse_at(s).map_err(|e| Failure::usage(format!("--at \"{s}\": {e}")))
}

/// Bytes as JSON text: the string itself when it is UTF-8, escaped when not.
pub fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => escape_bytes(b),
    }
}

/// Shows bytes as text where printable, `\xNN` where not.
pub fn escape_bytes(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

async fn dead(action: DeadAction) -> Result<(), Failure> {
    use crate::tasks::dead::{self as dead_set, Action};
    let (act, action) = match action {
        DeadAction::List(a) => return dead_list(a).await,
        DeadAction::Requeue(a) => (a, Action::Requeue),
        DeadAction::Purge(a) => (a, Action::Purge),
    };
    let cfg = config::load(&act.dead.config.config)?;
    let b = cfg.business(&act.dead.business).map_err(Failure::usage)?;
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    let filter = act.filter();
    let limit = act.dead.limit.unwrap_or(usize::MAX);
    let (done, verb) = if act.dry_run {
        let mut n = dead_set::count(&stores, &filter).await?;
        n.count = n.count.min(limit as u64);
        let verb = match action {
            Action::Requeue => "would requeue",
            Action::Purge => "would purge",
        };
        (n, verb)
    } else {
        let n = dead_set::apply(&stores, &filter, action, limit).await?;
        let verb = match action {
            Action::Requeue => "requeued",
            Action::Purge => "purged",
        };
        (n, verb)
    };
    let due = if action == Action::Requeue {
        ", due now"
    } else {
        ""
    };
    let partial = if done.partial {
        " (the reason search stopped early: more may match)"
    } else {
        ""
    };
    println!(
        "{verb} {} dead members of business \"{}\"{due}{partial}",
        done.count, b.name
    );
    Ok(())
}

/// `delayd dead list`: the oldest dead members, over every shard.
async fn dead_list(args: DeadArgs) -> Result<(), Failure> {
    let cfg = config::load(&args.config.config)?;
    let b = cfg.business(&args.business).map_err(Failure::usage)?;
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    // --limit bounds the whole business, however many shards it has.
    let (now, members) = crate::tasks::dead::list(&stores, args.limit.unwrap_or(100)).await?;
    for m in &members {
        let age = Duration::from_millis((now as f64 - m.died_ms).max(0.0) as u64);
        println!(
            "{}\tdied {} ago\t{}",
            escape_bytes(&m.member),
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            m.reason
        );
    }
    eprintln!(
        "{} dead members shown for business \"{}\"",
        members.len(),
        b.name
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_shows_binary_safely() {
        assert_eq!(escape_bytes(b"ok\x00\xff"), "ok\\x00\\xff");
    }

    #[test]
    fn at_names_the_flag() {
        assert!(parse_at("tomorrow")
            .unwrap_err()
            .message
            .starts_with("--at \"tomorrow\": "));
    }
}
