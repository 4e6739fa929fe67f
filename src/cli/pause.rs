//! `delayd pause BUSINESS` and `delayd resume BUSINESS`: stop and restart
//! claims of a business on every instance at once; pending work stays.

use super::{redis_conn, stores, ConfigArg, Failure};
use crate::config;
use crate::tasks::pause;

/// Arguments of `delayd pause` and `delayd resume`.
#[derive(Debug, clap::Args)]
pub(super) struct PauseArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business to pause or resume.
    business: String,
}

/// Pauses (`on`) or resumes the business, and says what changed.
pub(super) async fn run(a: PauseArgs, on: bool) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    let redis = |e: crate::store::StoreError| {
        Failure::runtime(format!("business \"{}\": redis: {e}", b.name))
    };
    let changed = if on {
        pause::pause(&stores, "cli").await.map_err(redis)?
    } else {
        pause::resume(&stores).await.map_err(redis)?
    };
    super::audit_cli(
        &conn,
        &b.name,
        if on { "pause" } else { "resume" },
        "every key",
        changed as u64,
    )
    .await;
    let (verb, already) = if on {
        (
            "paused: no instance claims from it until `delayd resume`",
            "was paused already",
        )
    } else {
        ("resumed: claims run again", "was not paused")
    };
    if changed == 0 {
        println!("business \"{}\" {already}", b.name);
    } else {
        println!("business \"{}\" {verb}", b.name);
    }
    Ok(())
}
