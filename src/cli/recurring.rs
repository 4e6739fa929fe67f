//! `delayd recurring BUSINESS`: each schedule's next occurrences, computed
//! from the configuration (no server is needed); with `--state`, also
//! whether it is paused, what it missed and the latest delivered (from
//! Redis). The actions on one schedule are in `recurring_control`.

use clap::Args;

use super::{ConfigArg, Failure};
use crate::config::{self, Business};
use crate::recurring::occurrences::between;
use crate::recurring::view::{self, occurrence, ScheduleState};
use crate::text::human_ms;

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
    /// Also read each schedule's state from Redis: paused, missed, the
    /// latest delivered.
    #[arg(long)]
    state: bool,
    #[command(flatten)]
    action: super::recurring_control::ActionArgs,
}

pub(super) async fn recurring(a: RecurringArgs) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    if let Some(why) = crate::recurring::none_in(b) {
        return Err(Failure::usage(why));
    }
    if a.action.any() {
        return super::recurring_control::run(&cfg, b, &a.action).await;
    }
    let count = a.count.min(1000);
    if a.state {
        let conn = super::redis_conn(&cfg).await?;
        let (now, states) = view::states(&conn, b, count)
            .await
            .map_err(|e| Failure::runtime(format!("business \"{}\": redis: {e}", b.name)))?;
        return print_states(&states, now, a.json);
    }
    print_offline(b, count, a.json);
    Ok(())
}

/// The next occurrences from the configuration alone.
fn print_offline(b: &Business, count: usize, json: bool) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut all = Vec::new();
    for s in &b.recurring {
        let next: Vec<view::Occurrence> = between(s, now, i64::MAX, count)
            .into_iter()
            .map(|ms| occurrence(s, ms))
            .collect();
        if !json {
            println!(
                "{} ({} in {}, catch_up {}):",
                s.name,
                s.cron_text,
                s.tz,
                format!("{:?}", s.catch_up).to_lowercase()
            );
            for n in &next {
                println!("  {}  {}", n.local, n.id);
            }
        }
        all.push(serde_json::json!({
            "schedule": s.name,
            "cron": s.cron_text,
            "tz": s.tz.name(),
            "next": next,
        }));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
    }
}

/// The schedules with their state in Redis.
fn print_states(states: &[ScheduleState], now: i64, json: bool) -> Result<(), Failure> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(states).unwrap_or_default()
        );
        return Ok(());
    }
    for s in states {
        let paused = match &s.paused {
            Some(p) => format!(
                "PAUSED by {} {} ago",
                p.by,
                human_ms(Some((now - p.since_ms).max(0)))
            ),
            None => "running".into(),
        };
        println!(
            "{} ({} in {}, catch_up {}): {paused}, missed {}",
            s.name, s.cron, s.tz, s.catch_up, s.missed
        );
        let last = s
            .last_delivered
            .as_ref()
            .map_or("none".into(), |o| format!("{}  {}", o.local, o.id));
        println!("  last delivered: {last}");
        for n in &s.next {
            println!("  next: {}  {}", n.local, n.id);
        }
    }
    Ok(())
}
