//! `delayd recurring BUSINESS`: each schedule's next occurrences, computed
//! from the configuration (no server is needed).

use chrono::TimeZone;
use clap::Args;

use super::{ConfigArg, Failure};
use crate::config;
use crate::recurring::occurrences::between;

/// Arguments of `delayd recurring`.
#[derive(Debug, Args)]
pub(super) struct RecurringArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business whose schedules to show.
    business: String,
    /// Occurrences to show per schedule.
    #[arg(long, default_value_t = 5)]
    count: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(super) fn recurring(a: RecurringArgs) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    if b.recurring.is_empty() {
        return Err(Failure::usage(format!(
            "business \"{}\" has no recurring schedules ([businesses.{}.recurring.NAME])",
            b.name, b.name
        )));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut all = Vec::new();
    for s in &b.recurring {
        let next: Vec<serde_json::Value> = between(s, now, i64::MAX, a.count.min(1000))
            .into_iter()
            .map(|ms| {
                let local = s
                    .tz
                    .timestamp_millis_opt(ms)
                    .single()
                    .map(|t| t.format("%Y-%m-%d %H:%M:%S %Z").to_string())
                    .unwrap_or_default();
                serde_json::json!({ "id": format!("{}@{ms}", s.name), "due_ms": ms, "local": local })
            })
            .collect();
        if !a.json {
            println!(
                "{} ({} in {}, catch_up {}):",
                s.name,
                s.cron_text,
                s.tz,
                format!("{:?}", s.catch_up).to_lowercase()
            );
            for n in &next {
                println!(
                    "  {}  {}",
                    n["local"].as_str().unwrap_or(""),
                    n["id"].as_str().unwrap_or("")
                );
            }
        }
        all.push(serde_json::json!({
            "schedule": s.name,
            "cron": s.cron_text,
            "tz": s.tz.name(),
            "next": next,
        }));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
    }
    Ok(())
}
