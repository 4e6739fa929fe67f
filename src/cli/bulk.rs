//! `delayd bulk cancel|reschedule|requeue|purge`: act on a filtered set,
//! counting first. `--dry-run` prints the count; acting needs `--confirm N`
//! with that count and touches at most N members, a bounded step at a
//! time, then writes one audit entry with the filter and the total.

use clap::{Args, Subcommand};

use super::{parse_at, parse_range, redis_conn, stores, ConfigArg, Failure};
use crate::config::{self, Business};
use crate::progress::Progress;
use crate::store::StoreError;
use crate::tasks::audit::Write;
use crate::tasks::bulk::{self, tenant_refused, Act, Pick, Scope};
use crate::tasks::{redis_now_ms, when};

/// A bulk action.
#[derive(Debug, Subcommand)]
pub(super) enum BulkAction {
    /// Cancel pending tasks by due range or member prefix.
    Cancel(PendingArgs),
    /// Move pending tasks, by due range or member prefix, to a new due time.
    Reschedule(RescheduleArgs),
    /// Requeue dead members whose reason contains some text, due now.
    Requeue(DeadArgs),
    /// Purge dead members whose reason contains some text.
    Purge(DeadArgs),
}

/// The business, counting or confirming.
#[derive(Debug, Args)]
pub(super) struct Common {
    #[command(flatten)]
    config: ConfigArg,
    /// The business to act on.
    business: String,
    /// Print how many members the filter picks, and change nothing.
    #[arg(long, conflicts_with = "confirm")]
    dry_run: bool,
    /// Act, on at most this many members: the count --dry-run printed.
    #[arg(long, value_name = "COUNT")]
    confirm: Option<u64>,
    /// A business with tenants: only this tenant's pending tasks (without
    /// it, K's and every tenant's).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
}

/// Which pending tasks: a due range or a member prefix.
#[derive(Debug, Args)]
pub(super) struct PendingArgs {
    #[command(flatten)]
    common: Common,
    /// Tasks due at or after this time (RFC 3339 or epoch ms).
    #[arg(long, value_name = "TIME", conflicts_with = "prefix")]
    from: Option<String>,
    /// Tasks due at or before this time (RFC 3339 or epoch ms).
    #[arg(long, value_name = "TIME", conflicts_with = "prefix")]
    to: Option<String>,
    /// Tasks whose member (the id in id mode) starts with this.
    #[arg(long)]
    prefix: Option<String>,
}

/// Which pending tasks, and when they become due.
#[derive(Debug, Args)]
pub(super) struct RescheduleArgs {
    #[command(flatten)]
    pending: PendingArgs,
    /// Due after this long on Redis's clock, e.g. 30s, 5m (0s: now).
    #[arg(long = "in", value_name = "DUR", conflicts_with = "at")]
    in_: Option<String>,
    /// Due at this time: RFC 3339 or epoch milliseconds.
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
}

/// Which dead members: by reason.
#[derive(Debug, Args)]
pub(super) struct DeadArgs {
    #[command(flatten)]
    common: Common,
    /// Dead members whose reason contains this text.
    #[arg(long)]
    reason: String,
}

impl PendingArgs {
    fn pick(&self) -> Result<Pick, Failure> {
        match (&self.prefix, &self.from, &self.to) {
            (Some(p), _, _) if p.is_empty() => Err(Failure::usage(
                "--prefix is empty; give the start of the members",
            )),
            (Some(p), _, _) => Ok(Pick::Prefix(p.clone().into_bytes())),
            (None, None, None) => Err(Failure::usage(
                "give a due range (--from and/or --to) or --prefix",
            )),
            (None, from, to) => Ok(Pick::Due(parse_range(from.as_deref(), to.as_deref())?)),
        }
    }
}

/// `delayd bulk ...`: counts, or acts in bounded steps and writes the audit.
pub(super) async fn run(action: BulkAction) -> Result<(), Failure> {
    let (common, pick, due) = picked(&action)?;
    let cfg = config::load(&common.config.config)?;
    let b = cfg.business(&common.business).map_err(Failure::usage)?;
    if let Some(why) = tenant_refused(b, &pick, common.tenant.as_deref()) {
        return Err(Failure::usage(format!("--tenant: {why}")));
    }
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    let scope = Scope {
        stores: &stores,
        unit: b.score_unit,
        tenant: common.tenant.as_deref(),
    };
    let confirmed = match common.confirm {
        Some(n) if !common.dry_run => n,
        _ => return count(scope, b, &pick, common.dry_run).await,
    };
    let act = match (&action, due) {
        (BulkAction::Cancel(_), _) => Act::Cancel,
        (BulkAction::Requeue(_), _) => Act::Requeue,
        (BulkAction::Purge(_), _) => Act::Purge,
        (_, due) => {
            let mut c = conn.clone();
            let now = redis_now_ms(&mut c).await.map_err(redis(b))?;
            Act::Reschedule(due_ms(due, now)?)
        }
    };
    let (total, failed) = act_in_steps(scope, b, &pick, act, confirmed).await;
    let what = bulk::describe(&pick, act, scope.tenant);
    let write = Write {
        by: "cli",
        business: &b.name,
        action: act.name(),
        what: &what,
        count: total,
    };
    super::audit(&conn, &write).await;
    println!(
        "{}: {total} members of business \"{}\" ({what})",
        act.name(),
        b.name
    );
    failed.map_or(Ok(()), Err)
}

/// The `--in`/`--at` pair of a reschedule.
type Due<'a> = Option<(&'a Option<String>, &'a Option<String>)>;

/// The action's common arguments, what it picks and (for a reschedule) the
/// new due time, each checked before anything is counted: a dry run must
/// not pass what the act refuses.
fn picked(action: &BulkAction) -> Result<(&Common, Pick, Due<'_>), Failure> {
    Ok(match action {
        BulkAction::Cancel(a) => (&a.common, a.pick()?, None),
        BulkAction::Reschedule(a) => {
            if a.in_.is_none() && a.at.is_none() {
                return Err(Failure::usage(
                    "give the new due time with --in DUR or --at TIME",
                ));
            }
            due_ms(Some((&a.in_, &a.at)), 0)?;
            (&a.pending.common, a.pending.pick()?, Some((&a.in_, &a.at)))
        }
        BulkAction::Requeue(a) | BulkAction::Purge(a) if a.reason.is_empty() => {
            return Err(Failure::usage(
                "--reason is empty; give text the dead reasons contain",
            ))
        }
        BulkAction::Requeue(a) | BulkAction::Purge(a) => {
            (&a.common, Pick::Reason(a.reason.clone()), None)
        }
    })
}

/// A Redis failure, naming the business.
fn redis(b: &Business) -> impl Fn(StoreError) -> Failure + '_ {
    move |e| Failure::runtime(format!("business \"{}\": redis: {e}", b.name))
}

/// Prints how many members `pick` picks; without `--dry-run`, a usage
/// failure that asks for `--confirm` with that count.
async fn count(scope: Scope<'_>, b: &Business, pick: &Pick, dry_run: bool) -> Result<(), Failure> {
    let n = bulk::count(scope, pick).await.map_err(redis(b))?;
    let more = if n.partial {
        " at least (the count stopped early)"
    } else {
        ""
    };
    println!(
        "{} members of business \"{}\" picked by {}{more}",
        n.count,
        b.name,
        bulk::describe(pick, Act::Cancel, scope.tenant)
    );
    if dry_run {
        return Ok(());
    }
    Err(Failure::usage(format!(
        "nothing done: to act, run again with --confirm {} (the count above)",
        n.count
    )))
}

/// Acts on at most `confirmed` members a bounded step at a time, showing
/// progress on a terminal; how many it touched, and the failure that
/// stopped it early.
async fn act_in_steps(
    scope: Scope<'_>,
    b: &Business,
    pick: &Pick,
    act: Act,
    confirmed: u64,
) -> (u64, Option<Failure>) {
    let progress = Progress::new(&format!("{} \"{}\"", act.name(), b.name), Some(confirmed));
    let (mut total, mut cursor) = (0u64, None::<String>);
    loop {
        match bulk::step(scope, pick, act, cursor.as_deref(), confirmed).await {
            Ok(s) => {
                total += s.touched;
                progress.add(s.touched);
                cursor = s.cursor;
            }
            Err(e) => {
                progress.finish();
                return (total, Some(redis(b)(e)));
            }
        }
        if cursor.is_none() {
            progress.finish();
            return (total, None);
        }
    }
}

/// The due time `--in` or `--at` gives, on Redis's clock `now`.
fn due_ms(due: Option<(&Option<String>, &Option<String>)>, now: i64) -> Result<i64, Failure> {
    match due {
        Some((Some(d), _)) => when::parse_in(d)
            .map(|d| when::after(now, d))
            .map_err(|e| Failure::usage(format!("--in \"{d}\": {e}"))),
        Some((None, Some(a))) => parse_at(a),
        _ => Ok(now),
    }
}
