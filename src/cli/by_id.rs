//! `delayd schedule`, `get`, `cancel`, `reschedule` and `list`: one task
//! addressed by its member (the id in id mode, the body in body mode).
//!
//! Exit codes beyond 0/1/2: 3 when the task is in flight (a delivery is
//! under way, so it cannot be cancelled or moved), 4 when nothing pending
//! answers to the member (dead, delivered, cancelled or never scheduled).

use std::io::Read;

use clap::Args;

use super::{parse_at, redis_conn, ConfigArg, Failure};
use crate::config::{self, Business, Config, MemberMode};
use crate::redis_conn::RedisConn;
use crate::tasks::{self, Cancelled, TaskState};
use crate::text::{escape_bytes, human_ms, text};

/// Exit code: the task is in flight.
pub const EXIT_IN_FLIGHT: u8 = 3;
/// Exit code: nothing pending answers to the member.
pub const EXIT_NOT_PENDING: u8 = 4;

/// When a task is due: exactly one of the three.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(super) struct When {
    /// Due after this long on Redis's clock, e.g. 250ms, 30s, 5m (0s: now).
    #[arg(long = "in", value_name = "DUR")]
    in_: Option<String>,
    /// Due at this time: RFC 3339 (2026-01-02T03:04:05Z) or epoch milliseconds.
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// Due at this epoch millisecond.
    #[arg(long = "at-ms", value_name = "MS")]
    at_ms: Option<i64>,
}

impl When {
    /// The due time in epoch ms, given Redis's clock.
    fn due_ms(&self, now_ms: i64) -> Result<i64, Failure> {
        if let Some(d) = &self.in_ {
            let d = tasks::when::parse_in(d)
                .map_err(|e| Failure::usage(format!("--in \"{d}\": {e}")))?;
            return Ok(tasks::when::after(now_ms, d));
        }
        if let Some(a) = &self.at {
            return parse_at(a);
        }
        Ok(self.at_ms.unwrap_or(now_ms))
    }
}

/// Arguments of `delayd schedule`.
#[derive(Debug, Args)]
pub(super) struct ScheduleArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business to schedule for.
    business: String,
    /// The task id (businesses with member = "id"; required there).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// The task's tenant, on a business with tenants = true (the tenant
    /// "default" when omitted); refused on a business without.
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    #[command(flatten)]
    when: When,
    /// The body; read from standard input when omitted.
    body: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `delayd get` and `delayd cancel`.
#[derive(Debug, Args)]
pub(super) struct MemberArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business the task belongs to.
    business: String,
    /// The task id (id mode) or the body itself (body mode).
    id: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `delayd reschedule`.
#[derive(Debug, Args)]
pub(super) struct RescheduleArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business the task belongs to.
    business: String,
    /// The task id (id mode) or the body itself (body mode).
    id: String,
    #[command(flatten)]
    when: When,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `delayd list`.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business whose pending tasks to list.
    business: String,
    /// Only tasks due at or after this time (RFC 3339 or epoch ms).
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// Only tasks due at or before this time (RFC 3339 or epoch ms).
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
    /// Tasks per page.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Continue after the page that printed this cursor.
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
    /// A business with tenants: only this tenant's tasks (without it, K's
    /// and those of the 1,000 tenants due earliest).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// Widest body shown in body mode, in characters.
    #[arg(long, default_value_t = 60)]
    width: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn load(path: &std::path::Path, business: &str) -> Result<(Config, Business), Failure> {
    let cfg = config::load(path)?;
    let b = cfg.business(business).map_err(Failure::usage)?.clone();
    Ok((cfg, b))
}

/// A connection to the business's Redis, and Redis's clock in epoch ms.
async fn connect(cfg: &Config, b: &Business) -> Result<(RedisConn, i64), Failure> {
    let mut conn = redis_conn(cfg).await?;
    let now_ms = tasks::redis_now_ms(&mut conn)
        .await
        .map_err(redis_err(&b.name))?;
    Ok((conn, now_ms))
}

fn redis_err(business: &str) -> impl Fn(crate::store::StoreError) -> Failure + '_ {
    move |e| Failure::runtime(format!("business \"{business}\": redis: {e}"))
}

/// What the member is called in output: an id, or a body in body mode.
fn member_word(b: &Business) -> &'static str {
    match b.member {
        MemberMode::Id { .. } => "id",
        MemberMode::Body => "body",
    }
}

/// How output names a task: `id "x" of business "billing"`.
fn task_name(b: &Business, id: &str) -> String {
    format!("{} \"{id}\" of business \"{}\"", member_word(b), b.name)
}

/// What the audit log names for a write on one task: the id, or only the
/// size of a body (a body may hold what the log must not keep).
fn member_what(b: &Business, member: &str) -> String {
    match b.member {
        MemberMode::Id { .. } => format!("id \"{member}\""),
        MemberMode::Body => format!("a body of {} bytes", member.len()),
    }
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// `schedule`'s fixes name `--id`.
const ID_FIXES: tasks::IdFixes = tasks::IdFixes {
    give_id: "give the task's id with --id ID",
    drop_id: "--id does not apply; set member = \"id\" to schedule by id",
};

pub(super) async fn schedule(a: ScheduleArgs) -> Result<(), Failure> {
    let (cfg, b) = load(&a.config.config, &a.business)?;
    super::tenant_ok(&b, a.tenant.as_deref())?;
    if let Some(why) = tasks::id_refused(&b, a.id.is_some(), &ID_FIXES) {
        return Err(Failure::usage(why));
    }
    // The body is read only once the id fits: stdin may be a terminal.
    let (member, body) = match &a.id {
        Some(id) => (id.clone().into_bytes(), Some(read_body(a.body)?)),
        None => (read_body(a.body)?, None),
    };
    let (mut conn, now_ms) = connect(&cfg, &b).await?;
    let due_ms = a.when.due_ms(now_ms)?;
    let tenant = a.tenant.as_deref().map(str::as_bytes);
    let key = tasks::schedule(&mut conn, &b, &member, body.as_deref(), tenant, due_ms)
        .await
        .map_err(redis_err(&b.name))?;
    let bytes = body.as_ref().unwrap_or(&member).len();
    let what = if b.member.is_id() {
        format!("id \"{}\"", text(&member))
    } else {
        format!("a body of {} bytes", member.len())
    };
    super::audit_cli(&conn, &b.name, "schedule", &what, 1).await;
    if a.json {
        let mut v = serde_json::json!({
            "business": b.name, "key": key, "due_ms": due_ms, "bytes": bytes,
        });
        if b.member.is_id() {
            v["id"] = text(&member).into();
        }
        print_json(&v);
    } else if b.member.is_id() {
        println!(
            "scheduled id {} ({bytes} bytes) on {key}, due in {} (epoch ms {due_ms})",
            text(&member),
            human_ms(Some((due_ms - now_ms).max(0)))
        );
    } else {
        println!(
            "scheduled {bytes} bytes on {key}, due in {} (epoch ms {due_ms})",
            human_ms(Some((due_ms - now_ms).max(0)))
        );
    }
    Ok(())
}

fn read_body(body: Option<String>) -> Result<Vec<u8>, Failure> {
    match body {
        Some(b) => Ok(b.into_bytes()),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| Failure::runtime(format!("reading the body from stdin: {e}")))?;
            Ok(buf)
        }
    }
}

pub(super) async fn get(a: MemberArgs) -> Result<(), Failure> {
    let (cfg, b) = load(&a.config.config, &a.business)?;
    let (mut conn, now_ms) = connect(&cfg, &b).await?;
    let found = tasks::get(&mut conn, &b, a.id.as_bytes(), None)
        .await
        .map_err(redis_err(&b.name))?;
    if a.json {
        let mut v = serde_json::to_value(&found).unwrap_or_default();
        v["business"] = b.name.clone().into();
        v[member_word(&b)] = a.id.clone().into();
        match found
            .body
            .as_deref()
            .and_then(|body| crate::message::stored(&b, body))
        {
            Some(e) => {
                v["body"] = text(e.body).into();
                v["message"] = crate::message::envelope::describe(&e);
            }
            None => {
                if let Some(body) = &found.body {
                    v["body"] = text(body).into();
                }
            }
        }
        print_json(&v);
    } else {
        let what = task_name(&b, &a.id);
        let line = match &found.state {
            TaskState::Pending { due_ms } => format!(
                "{what}: pending on {}, due {} (epoch ms {due_ms})",
                found.key,
                relative(*due_ms, now_ms)
            ),
            TaskState::InFlight {
                lease_deadline_ms,
                pending_due_ms,
            } => format!(
                "{what}: in flight on {} (delivery under way, lease ends in {}){}",
                found.key,
                human_ms(Some((lease_deadline_ms - now_ms).max(0))),
                pending_due_ms
                    .map(|d| format!("; a copy re-added since is pending, due {}", relative(d, now_ms)))
                    .unwrap_or_default()
            ),
            TaskState::Dead {
                died_ms,
                reason,
                attempts,
            } => format!(
                "{what}: dead on {} since {} ago: {reason}{}",
                found.key,
                human_ms(Some((now_ms - died_ms).max(0))),
                attempts
                    .map(|n| format!(" ({n} attempts)"))
                    .unwrap_or_default()
            ),
            TaskState::NotFound => format!(
                "{what}: not found (not pending, in flight or dead: delivered, cancelled or never scheduled)"
            ),
        };
        println!("{line}");
        match found
            .body
            .as_deref()
            .and_then(|body| crate::message::stored(&b, body))
        {
            Some(e) => {
                println!("routing key: {}", escape_bytes(e.routing_key.as_bytes()));
                println!("body: {}", escape_bytes(e.body));
            }
            None => {
                if let Some(body) = &found.body {
                    println!("body: {}", escape_bytes(body));
                }
            }
        }
    }
    if found.state == TaskState::NotFound {
        return Err(Failure::status(EXIT_NOT_PENDING));
    }
    Ok(())
}

/// "in 5s" for a time ahead, "5s ago" for one past.
fn relative(due_ms: i64, now_ms: i64) -> String {
    if due_ms >= now_ms {
        format!("in {}", human_ms(Some(due_ms - now_ms)))
    } else {
        format!("{} ago", human_ms(Some(now_ms - due_ms)))
    }
}

pub(super) async fn cancel(a: MemberArgs) -> Result<(), Failure> {
    let (cfg, b) = load(&a.config.config, &a.business)?;
    let mut conn = redis_conn(&cfg).await?;
    let (key, outcome) = tasks::cancel(&mut conn, &b, a.id.as_bytes())
        .await
        .map_err(redis_err(&b.name))?;
    let count = (outcome == Cancelled::Cancelled) as u64;
    super::audit_cli(&conn, &b.name, "cancel", &member_what(&b, &a.id), count).await;
    if a.json {
        let mut v = serde_json::json!({ "business": b.name, "key": key, "result": outcome });
        v[member_word(&b)] = a.id.clone().into();
        print_json(&v);
    } else {
        let what = task_name(&b, &a.id);
        println!(
            "{what}: {}",
            match outcome {
                Cancelled::Cancelled => format!("cancelled (removed from {key})"),
                Cancelled::InFlight => "in flight: delivery under way, not cancelled".to_string(),
                Cancelled::Dead =>
                    "not pending: it is dead; `delayd dead purge` removes dead tasks".to_string(),
                Cancelled::NotFound =>
                    "not pending: delivered, cancelled already or never scheduled".to_string(),
            }
        );
    }
    match outcome {
        Cancelled::Cancelled => Ok(()),
        Cancelled::InFlight => Err(Failure::status(EXIT_IN_FLIGHT)),
        Cancelled::Dead | Cancelled::NotFound => Err(Failure::status(EXIT_NOT_PENDING)),
    }
}

pub(super) async fn reschedule(a: RescheduleArgs) -> Result<(), Failure> {
    let (cfg, b) = load(&a.config.config, &a.business)?;
    let (mut conn, now_ms) = connect(&cfg, &b).await?;
    let due_ms = a.when.due_ms(now_ms)?;
    let moved = tasks::reschedule(&mut conn, &b, a.id.as_bytes(), due_ms)
        .await
        .map_err(redis_err(&b.name))?;
    let count = moved.is_some() as u64;
    super::audit_cli(&conn, &b.name, "reschedule", &member_what(&b, &a.id), count).await;
    // Not pending: say where it is instead.
    let state = match moved {
        Some(_) => None,
        None => Some(
            tasks::get(&mut conn, &b, a.id.as_bytes(), None)
                .await
                .map_err(redis_err(&b.name))?
                .state,
        ),
    };
    let result = match &state {
        None => "rescheduled",
        Some(TaskState::InFlight { .. }) => "in_flight",
        Some(TaskState::Dead { .. }) => "dead",
        Some(_) => "not_found",
    };
    if a.json {
        let mut v = serde_json::json!({ "business": b.name, "result": result });
        v[member_word(&b)] = a.id.clone().into();
        if let Some(key) = &moved {
            v["key"] = key.clone().into();
            v["due_ms"] = due_ms.into();
        }
        print_json(&v);
    } else {
        let what = task_name(&b, &a.id);
        match (&moved, result) {
            (Some(key), _) => println!(
                "{what}: rescheduled on {key}, due {} (epoch ms {due_ms})",
                relative(due_ms, now_ms)
            ),
            (None, "in_flight") => println!("{what}: in flight: delivery under way, not moved"),
            (None, "dead") => println!(
                "{what}: not pending: it is dead; `delayd dead requeue` brings dead tasks back"
            ),
            (None, _) => println!(
                "{what}: not pending: delivered, cancelled or never scheduled; schedule it anew"
            ),
        }
    }
    match result {
        "rescheduled" => Ok(()),
        "in_flight" => Err(Failure::status(EXIT_IN_FLIGHT)),
        _ => Err(Failure::status(EXIT_NOT_PENDING)),
    }
}

pub(super) async fn list(a: ListArgs) -> Result<(), Failure> {
    let (cfg, b) = load(&a.config.config, &a.business)?;
    if a.limit == 0 || a.limit > 100_000 {
        return Err(Failure::usage(format!(
            "--limit must be between 1 and 100000 (got {})",
            a.limit
        )));
    }
    if let Some(c) = &a.cursor {
        if !tasks::valid_cursor(c) {
            return Err(Failure::usage(format!(
                "--cursor \"{c}\" is not a cursor delayd list printed; pass the one from the previous page's last line"
            )));
        }
    }
    let range = super::parse_range(a.from.as_deref(), a.to.as_deref())?;
    super::tenant_ok(&b, a.tenant.as_deref())?;
    let (mut conn, now_ms) = connect(&cfg, &b).await?;
    let page = tasks::list(
        &mut conn,
        &b,
        range,
        a.limit,
        a.cursor.as_deref(),
        a.tenant.as_deref(),
    )
    .await
    .map_err(redis_err(&b.name))?;
    let word = member_word(&b);
    if a.json {
        let tasks: Vec<serde_json::Value> = page
            .tasks
            .iter()
            .map(|t| {
                let mut v = serde_json::json!({ word: text(&t.member.head), "due_ms": t.due_ms });
                if t.member.digest.is_some() {
                    v["bytes"] = t.member.size.into();
                    v["truncated"] = true.into();
                }
                v
            })
            .collect();
        print_json(&serde_json::json!({
            "business": b.name, "tasks": tasks, "cursor": page.cursor,
        }));
        return Ok(());
    }
    for t in &page.tasks {
        let shown = match b.member {
            MemberMode::Id { .. } => t.member.escaped(),
            MemberMode::Body => cut(&t.member.escaped(), a.width),
        };
        println!("{}\t{}\t{shown}", t.due_ms, relative(t.due_ms, now_ms));
    }
    match &page.cursor {
        Some(c) => eprintln!("{} tasks shown; more with --cursor {c}", page.tasks.len()),
        None => eprintln!("{} tasks shown; end of list", page.tasks.len()),
    }
    Ok(())
}

/// `s` cut to `width` characters, marked with an ellipsis when cut.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_cut_to_the_width() {
        assert_eq!(cut("abcdef", 10), "abcdef");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn in_is_relative_to_redis_clock() {
        let w = When {
            in_: Some("1s".into()),
            at: None,
            at_ms: None,
        };
        assert_eq!(w.due_ms(1000).ok(), Some(2000));
        let w = When {
            in_: None,
            at: None,
            at_ms: Some(5),
        };
        assert_eq!(w.due_ms(1000).ok(), Some(5));
    }
}
