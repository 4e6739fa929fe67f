//! `delayd dead`: list the dead set, and requeue or purge all of it, one
//! member or those whose reason matches, counting first with `--dry-run`.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::{redis_conn, stores, ConfigArg, Failure};
use crate::config;

/// What to do with the dead set.
#[derive(Debug, Subcommand)]
pub(super) enum DeadAction {
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
pub(super) struct DeadActArgs {
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

/// The business and how many of its dead members.
#[derive(Debug, Args)]
pub(super) struct DeadArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business whose dead set to use.
    business: String,
    /// At most this many members (list defaults to 100, requeue and purge to all).
    #[arg(long)]
    limit: Option<usize>,
}

/// `delayd dead list|requeue|purge`.
pub(super) async fn run(action: DeadAction) -> Result<(), Failure> {
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
        let what = match (&act.member, &act.reason) {
            (Some(m), _) => format!("member \"{m}\""),
            (None, Some(r)) => format!("reason containing \"{r}\""),
            (None, None) => "all".into(),
        };
        let write = crate::tasks::audit::Write {
            by: "cli",
            business: &b.name,
            action: action.name(),
            what: &what,
            count: n.count,
        };
        super::audit(&conn, &write).await;
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
            m.member.escaped(),
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
