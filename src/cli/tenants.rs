//! `delayd tenants BUSINESS`: a business's tenants, the earliest head
//! first, with pending, due now, oldest overdue, weight, `max_rate` and
//! pause; with `--pause T`, `--resume T`, `--weight T=N` or
//! `--max-rate T=N`, steers one tenant on every
//! instance, recorded in the audit log as by `cli`.

use clap::Args;

use super::{redis_conn, stores, ConfigArg, Failure};
use crate::config::{self, Business, TenantSetting};
use crate::store::StoreError;
use crate::tasks::tenants::{self, TenantList, MOST_LISTED};
use crate::text::{human_ms, utc_ms};

/// Arguments of `delayd tenants`.
#[derive(Debug, Args)]
pub(super) struct TenantsArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business with tenants.
    business: String,
    /// Tenants to show per key, the earliest head first (at most 1000).
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// Skip this many tenants of each key's index first.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    action: ActionArgs,
}

/// The action on one tenant, at most one.
#[derive(Debug, Args)]
#[group(multiple = false)]
struct ActionArgs {
    /// Pause this tenant on every instance: none of its members is claimed
    /// until `--resume`; producers go on writing.
    #[arg(long, value_name = "TENANT")]
    pause: Option<String>,
    /// Let this paused tenant's members be claimed again.
    #[arg(long, value_name = "TENANT")]
    resume: Option<String>,
    /// Set a tenant's weight from the next claim on (TENANT=1..1000), or
    /// return it to the config's (TENANT=default).
    #[arg(long, value_name = "TENANT=WEIGHT")]
    weight: Option<String>,
    /// Set a tenant's most members a second over every instance
    /// (TENANT=1..10000000), or return it to the config's (TENANT=default).
    #[arg(long, value_name = "TENANT=RATE")]
    max_rate: Option<String>,
}

/// Lists the tenants, or does the action.
pub(super) async fn run(a: TenantsArgs) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    if let Some(why) = tenants::none_in(b) {
        return Err(Failure::usage(why));
    }
    if !(1..=MOST_LISTED).contains(&a.limit) {
        return Err(Failure::usage(format!(
            "--limit must be from 1 to {MOST_LISTED} (got {})",
            a.limit
        )));
    }
    let setting = match (&a.action.weight, &a.action.max_rate) {
        (Some(w), _) => Some(parse_setting(TenantSetting::Weight, w)?),
        (_, Some(r)) => Some(parse_setting(TenantSetting::MaxRate, r)?),
        _ => None,
    };
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    let redis = |e: StoreError| Failure::runtime(format!("business \"{}\": redis: {e}", b.name));
    let toggle = match (&a.action.pause, &a.action.resume) {
        (Some(t), _) => Some((t, true)),
        (_, Some(t)) => Some((t, false)),
        _ => None,
    };
    let (action, tenant, count, said) = if let Some((t, pause)) = toggle {
        check_tenant(b, t)?;
        let n = match pause {
            true => tenants::pause(&stores, t.as_bytes(), "cli").await,
            false => tenants::resume(&stores, t.as_bytes()).await,
        }
        .map_err(redis)?;
        let action = if pause {
            "tenant_pause"
        } else {
            "tenant_resume"
        };
        (action, t, n, toggled_said(t, pause, n > 0))
    } else if let Some((setting, t, v)) = &setting {
        check_tenant(b, t)?;
        tenants::set(&stores, *setting, t.as_bytes(), *v)
            .await
            .map_err(redis)?;
        let config = b
            .tenants
            .as_ref()
            .and_then(|s| s.configured(*setting, t.as_bytes()));
        let said = set_said(*setting, t, *v, config);
        (setting.audit_action(), t, 1, said)
    } else {
        let l = tenants::list(b, &stores, a.offset, a.limit)
            .await
            .map_err(redis)?;
        print_list(&l, a.json);
        return Ok(());
    };
    super::audit_cli(&conn, &b.name, action, tenant, count as u64).await;
    println!("{said}");
    Ok(())
}

/// What a pause (`pause`) or resume of tenant `t` says, as it `changed`
/// the tenant's state or found it so already.
fn toggled_said(t: &str, pause: bool, changed: bool) -> String {
    match (pause, changed) {
        (true, true) => format!("tenant \"{t}\" paused on every instance: none of its members is claimed until `--resume {t}`"),
        (true, false) => format!("tenant \"{t}\" was paused already"),
        (false, true) => format!("tenant \"{t}\" resumed: its members are claimed again"),
        (false, false) => format!("tenant \"{t}\" was not paused"),
    }
}

/// `TENANT=N` (1 to the setting's most) or `TENANT=default`.
fn parse_setting(
    setting: TenantSetting,
    s: &str,
) -> Result<(TenantSetting, String, Option<u32>), Failure> {
    let (flag, most) = (setting.field().replace('_', "-"), setting.most());
    let bad = || {
        Failure::usage(format!(
            "--{flag} \"{s}\": give TENANT=N, N from 1 to {most}, or TENANT=default"
        ))
    };
    let (t, v) = s.rsplit_once('=').ok_or_else(bad)?;
    let v = match v {
        "default" => None,
        v => Some(
            v.parse::<u32>()
                .ok()
                .filter(|v| (1..=most).contains(v))
                .ok_or_else(bad)?,
        ),
    };
    Ok((setting, t.to_string(), v))
}

/// What `--weight` or `--max-rate` says it did.
fn set_said(setting: TenantSetting, t: &str, v: Option<u32>, config: Option<u32>) -> String {
    let config = config.map_or("none".to_string(), |c| c.to_string());
    match (setting, v) {
        (TenantSetting::Weight, Some(w)) => {
            format!("tenant \"{t}\" weighs {w} from the next claim on (its config weight: {config})")
        }
        (TenantSetting::Weight, None) => {
            format!("tenant \"{t}\" weighs its config weight again: {config}")
        }
        (TenantSetting::MaxRate, Some(r)) => format!(
            "tenant \"{t}\" is released at most {r} a second from the first claim that sees it due (its config max_rate: {config})"
        ),
        (TenantSetting::MaxRate, None) => {
            format!("tenant \"{t}\" has its config max_rate again: {config}")
        }
    }
}

fn check_tenant(b: &Business, t: &str) -> Result<(), Failure> {
    let Some(why) = crate::tasks::tenant_refused(b, t.as_bytes()) else {
        return Ok(());
    };
    // The name was refused: quoted with its control characters escaped and
    // cut, so that it can neither drive the terminal nor fill it.
    let mut shown = crate::text::visible(&t.chars().take(64).collect::<String>());
    if t.chars().nth(64).is_some() {
        shown.push('…');
    }
    Err(Failure::usage(format!("tenant \"{shown}\": {why}")))
}

fn print_list(l: &TenantList, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(l).unwrap_or_default());
        return;
    }
    println!(
        "{} tenant(s) with pending members, {} paused",
        l.tenants, l.paused
    );
    println!(
        "{:<24} {:>10} {:>10} {:>14} {:>10} {:>7} {:>10}  paused",
        "tenant", "pending", "due", "oldest overdue", "released/s", "weight", "max rate"
    );
    for r in &l.rows {
        let weight = format!(
            "{}{}",
            r.weight,
            if r.weight_set_at_run_time { "*" } else { "" }
        );
        let max_rate = format!(
            "{}{}",
            r.max_rate.map_or("-".to_string(), |m| m.to_string()),
            if r.max_rate_set_at_run_time { "*" } else { "" }
        );
        let paused = r.paused.as_ref().map_or(String::new(), |p| {
            format!("since {} by {}", utc_ms(p.since_ms), p.by)
        });
        println!(
            "{:<24} {:>10} {:>10} {:>14} {:>10} {:>7} {:>10}  {paused}",
            r.tenant,
            r.pending,
            r.due,
            human_ms((r.oldest_overdue_ms > 0).then_some(r.oldest_overdue_ms as i64)),
            r.released_per_s,
            weight,
            max_rate,
        );
    }
    if l.rows
        .iter()
        .any(|r| r.weight_set_at_run_time || r.max_rate_set_at_run_time)
    {
        println!(
            "* set at run time (--weight or --max-rate TENANT=default returns it to the config's)"
        );
    }
}
