//! The `delayd` commands and their exit codes: 0 success, 1 a runtime
//! failure (a server unreachable, a check failed), 2 a usage or config error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, Business, Config};
use crate::redis_conn::{Redis, RedisConn};
use crate::store::{Store, Totals};
use crate::text::human_ms;

mod adopt;
mod bulk;
mod by_id;
mod check;
mod dead;
mod pause;
mod recurring;
mod recurring_control;
mod search;
mod tenants;

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
    /// Find pending tasks by member prefix, or in id mode by text in the body.
    Search(search::SearchArgs),
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
    /// Print each recurring schedule's next occurrences (with `--state`,
    /// paused, missed, last delivered); pause, resume or run one now.
    Recurring(recurring::RecurringArgs),
    /// Look at and act on dead members.
    Dead {
        #[command(subcommand)]
        action: dead::DeadAction,
    },
    /// Act on a filtered set (pending by due range or prefix, dead by
    /// reason): count with --dry-run, then act with --confirm COUNT.
    Bulk {
        #[command(subcommand)]
        action: bulk::BulkAction,
    },
    /// List a business's tenants with their counts; pause, resume or
    /// weigh one tenant on every instance.
    Tenants(tenants::TenantsArgs),
    /// Stop claims of a business on every instance; pending work stays.
    Pause(pause::PauseArgs),
    /// Let a paused business's claims run again.
    Resume(pause::PauseArgs),
    /// Measure the broker's ceiling, delayd's drain rate, lateness and idle cost.
    Bench(crate::bench::BenchArgs),
    /// Move the messages the RabbitMQ delayed-message plugin holds into an
    /// intake business, each delivered once (or count them: --dry-run).
    Adopt(adopt::AdoptArgs),
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
    if !matches!(cli.command, Command::Run(_) | Command::Bench(_)) {
        end_quietly_on_a_closed_pipe();
    }
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

/// A command piped into `head` ends when the reader goes, as Unix tools
/// do. Rust's runtime ignores SIGPIPE, so the next print would panic with
/// "Broken pipe". `run` and `bench` keep ignoring it: they must clean up.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: no other thread exists yet, and SIG_DFL is a disposition
    // every Unix accepts for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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
                | crate::supervisor::RunError::UnreadKeys(_)
                | crate::supervisor::RunError::IntakeRedis(..)
                | crate::supervisor::RunError::IntakeExchange(..) => Failure::usage(e.to_string()),
                other => Failure::runtime(other.to_string()),
            })
        }
        Command::Check(c) => check::run(&config::load(&c.config)?).await,
        Command::Inspect { config: c, json } => inspect(&config::load(&c.config)?, json).await,
        Command::Schedule(a) => by_id::schedule(a).await,
        Command::Get(a) => by_id::get(a).await,
        Command::Cancel(a) => by_id::cancel(a).await,
        Command::Reschedule(a) => by_id::reschedule(a).await,
        Command::List(a) => by_id::list(a).await,
        Command::Search(a) => search::run(a).await,
        Command::Shards {
            config: c,
            business,
        } => shards(&config::load(&c.config)?, &business),
        Command::Dead { action } => dead::run(action).await,
        Command::Bulk { action } => bulk::run(action).await,
        Command::Pause(a) => pause::run(a, true).await,
        Command::Resume(a) => pause::run(a, false).await,
        Command::Recurring(a) => recurring::recurring(a).await,
        Command::Tenants(a) => tenants::run(a).await,
        Command::Adopt(a) => adopt::run(a).await,
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
        .map(|k| Store::of_business(conn.clone(), k, b))
        .collect()
}

/// Records a write in the audit log; the write is done, so a log that
/// cannot be written is a warning on stderr, not a failure.
async fn audit(conn: &RedisConn, write: &crate::tasks::audit::Write<'_>) {
    let mut conn = conn.clone();
    if let Err(e) = crate::tasks::audit::record(&mut conn, write).await {
        eprintln!("warning: the audit log entry was not written ({e})");
    }
}

/// Records a write of a command in the audit log, by `cli`, as the API
/// records its own.
async fn audit_cli(conn: &RedisConn, business: &str, action: &str, what: &str, count: u64) {
    let write = crate::tasks::audit::Write {
        by: "cli",
        business,
        action,
        what,
        count,
    };
    audit(conn, &write).await;
}

fn shards(cfg: &Config, business: &str) -> Result<(), Failure> {
    let b = cfg.business(business).map_err(Failure::usage)?;
    for k in b.keys() {
        println!("{k}\t{}", crate::keys::slot(&k));
    }
    Ok(())
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
    for r in &rows {
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
    for r in &rows {
        if let Some(p) = &r.paused {
            println!(
                "business \"{}\" is paused (by {}): nothing is claimed until `delayd resume`",
                r.business, p.by
            );
        }
    }
    Ok(())
}

/// Parses `--at`: epoch milliseconds or an RFC 3339 time.
fn parse_at(s: &str) -> Result<i64, Failure> {
    parse_time("--at", s)
}

/// A time given to `flag`: RFC 3339 or epoch ms.
fn parse_time(flag: &str, s: &str) -> Result<i64, Failure> {
    crate::tasks::when::parse_at(s).map_err(|e| Failure::usage(format!("{flag} \"{s}\": {e}")))
}

/// The due range `--from` and `--to` give; one that starts after it ends
/// is refused, as it could only ever pick nothing.
fn parse_range(from: Option<&str>, to: Option<&str>) -> Result<crate::tasks::Range, Failure> {
    crate::tasks::Range {
        from_ms: from.map(|s| parse_time("--from", s)).transpose()?,
        to_ms: to.map(|s| parse_time("--to", s)).transpose()?,
    }
    .ordered("--from", "--to")
    .map_err(Failure::usage)
}

/// Refuses a `--tenant` that cannot name tasks of `b` (no tenants, or not
/// a name producers could write).
fn tenant_ok(b: &Business, tenant: Option<&str>) -> Result<(), Failure> {
    match tenant.and_then(|t| crate::tasks::tenant_refused(b, t.as_bytes())) {
        Some(why) => Err(Failure::usage(format!("--tenant: {why}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_names_the_flag() {
        assert!(parse_at("tomorrow")
            .unwrap_err()
            .message
            .starts_with("--at \"tomorrow\": "));
    }

    #[test]
    fn range_names_its_flags_and_refuses_from_after_to() {
        let e = parse_range(Some("tomorrow"), None).unwrap_err();
        assert!(
            e.message.starts_with("--from \"tomorrow\": "),
            "{}",
            e.message
        );
        let e = parse_range(None, Some("x")).unwrap_err();
        assert!(e.message.starts_with("--to \"x\": "), "{}", e.message);
        let e = parse_range(Some("2000"), Some("1000")).unwrap_err();
        assert!(
            e.message.starts_with("--from (2000) is after --to (1000)"),
            "{}",
            e.message
        );
        let r = parse_range(Some("1000"), Some("1000")).unwrap();
        assert_eq!((r.from_ms, r.to_ms), (Some(1000), Some(1000)));
    }
}
