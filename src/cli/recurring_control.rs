//! `delayd recurring BUSINESS --pause S | --resume S | --run S`: pause or
//! resume one schedule on every instance, or deliver one extra occurrence
//! now; each recorded in the audit log as by `cli`.

use clap::Args;

use super::{redis_conn, Failure};
use crate::config::{Business, Config};
use crate::recurring::control;

/// The action on one schedule, at most one.
#[derive(Debug, Args)]
#[group(multiple = false)]
pub(super) struct ActionArgs {
    /// Pause this schedule on every instance: its occurrences written ahead
    /// are taken back and none is written until it resumes.
    #[arg(long, value_name = "SCHEDULE")]
    pause: Option<String>,
    /// Resume this paused schedule from now on.
    #[arg(long, value_name = "SCHEDULE")]
    resume: Option<String>,
    /// Deliver one extra occurrence of this schedule now.
    #[arg(long, value_name = "SCHEDULE")]
    run: Option<String>,
}

impl ActionArgs {
    /// Whether an action was asked for.
    pub(super) fn any(&self) -> bool {
        self.pause.is_some() || self.resume.is_some() || self.run.is_some()
    }
}

/// Does the action, says what changed, and records it.
pub(super) async fn run(cfg: &Config, b: &Business, a: &ActionArgs) -> Result<(), Failure> {
    let (action, name) = match (&a.pause, &a.resume, &a.run) {
        (Some(n), _, _) => ("schedule_pause", n),
        (_, Some(n), _) => ("schedule_resume", n),
        (_, _, Some(n)) => ("schedule_run", n),
        _ => return Ok(()),
    };
    let s = crate::recurring::named(b, name).map_err(Failure::usage)?;
    let conn = redis_conn(cfg).await?;
    let redis = |e: crate::store::StoreError| {
        Failure::runtime(format!("business \"{}\": redis: {e}", b.name))
    };
    let (count, said) = match action {
        "schedule_pause" => {
            let t = control::pause(&conn, b, s, "cli").await.map_err(redis)?;
            let said = if t.changed {
                format!("schedule \"{name}\" paused on every instance ({} occurrence(s) written ahead taken back); `--resume {name}` to resume", t.taken_back)
            } else {
                format!("schedule \"{name}\" was paused already")
            };
            (u64::from(t.changed), said)
        }
        "schedule_resume" => {
            let t = control::resume(&conn, b, s).await.map_err(redis)?;
            let said = if t.changed {
                format!("schedule \"{name}\" resumed: its occurrences from now on are written")
            } else {
                format!("schedule \"{name}\" was not paused")
            };
            (u64::from(t.changed), said)
        }
        _ => {
            let r = control::run_now(&conn, b, s).await.map_err(redis)?;
            (
                1,
                format!("one extra occurrence of \"{name}\" is due now: {}", r.id),
            )
        }
    };
    super::audit_cli(&conn, &b.name, action, name, count).await;
    println!("{said}");
    Ok(())
}
