//! `delayd tenants BUSINESS`: a business's tenants, the earliest head
//! first, with pending, due now, oldest overdue, weight and pause; with
//! `--pause T`, `--resume T` or `--weight T=N`, steers one tenant on every
//! instance, recorded in the audit log as by `cli`.

use clap::Args;

use super::{redis_conn, stores, ConfigArg, Failure};
use crate::config::{self, Business};
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
    let weight = a.action.weight.as_deref().map(parse_weight).transpose()?;
    let conn = redis_conn(&cfg).await?;
    let stores = stores(&conn, b);
    let redis = |e: StoreError| Failure::runtime(format!("business \"{}\": redis: {e}", b.name));
    let (action, tenant, count, said) = if let Some(t) = &a.action.pause {
        check_tenant(b, t)?;
        let n = tenants::pause(&stores, t.as_bytes(), "cli")
            .await
            .map_err(redis)?;
        let said = if n > 0 {
            format!("tenant \"{t}\" paused on every instance: none of its members is claimed until `--resume {t}`")
        } else {
            format!("tenant \"{t}\" was paused already")
        };
        ("tenant_pause", t, n, said)
    } else if let Some(t) = &a.action.resume {
        check_tenant(b, t)?;
        let n = tenants::resume(&stores, t.as_bytes())
            .await
            .map_err(redis)?;
        let said = if n > 0 {
            format!("tenant \"{t}\" resumed: its members are claimed again")
        } else {
            format!("tenant \"{t}\" was not paused")
        };
        ("tenant_resume", t, n, said)
    } else if let Some((t, w)) = &weight {
        check_tenant(b, t)?;
        tenants::set_weight(&stores, t.as_bytes(), *w)
            .await
            .map_err(redis)?;
        let config = b.tenants.as_ref().map_or(1, |s| s.weight(t.as_bytes()));
        let said = match w {
            Some(w) => format!(
                "tenant \"{t}\" weighs {w} from the next claim on (its config weight: {config})"
            ),
            None => format!("tenant \"{t}\" weighs its config weight again: {config}"),
        };
        ("tenant_weight", t, 1, said)
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

/// `TENANT=N` (1 to 1000) or `TENANT=default`.
fn parse_weight(s: &str) -> Result<(String, Option<u32>), Failure> {
    let bad = || {
        Failure::usage(format!(
            "--weight \"{s}\": give TENANT=WEIGHT, a weight from 1 to 1000, or TENANT=default"
        ))
    };
    let (t, w) = s.rsplit_once('=').ok_or_else(bad)?;
    let w = match w {
        "default" => None,
        w => Some(
            w.parse::<u32>()
                .ok()
                .filter(|w| (1..=1000).contains(w))
                .ok_or_else(bad)?,
        ),
    };
    Ok((t.to_string(), w))
}

fn check_tenant(b: &Business, t: &str) -> Result<(), Failure> {
    match crate::tasks::tenant_refused(b, t.as_bytes()) {
        Some(why) => Err(Failure::usage(format!("tenant \"{t}\": {why}"))),
        None => Ok(()),
    }
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
        "{:<24} {:>10} {:>10} {:>14} {:>10} {:>7}  paused",
        "tenant", "pending", "due", "oldest overdue", "released/s", "weight"
    );
    for r in &l.rows {
        let weight = format!(
            "{}{}",
            r.weight,
            if r.weight_set_at_run_time { "*" } else { "" }
        );
        let paused = r.paused.as_ref().map_or(String::new(), |p| {
            format!("since {} by {}", utc_ms(p.since_ms), p.by)
        });
        println!(
            "{:<24} {:>10} {:>10} {:>14} {:>10} {:>7}  {paused}",
            r.tenant,
            r.pending,
            r.due,
            human_ms((r.oldest_overdue_ms > 0).then_some(r.oldest_overdue_ms as i64)),
            r.released_per_s,
            weight,
        );
    }
    if l.rows.iter().any(|r| r.weight_set_at_run_time) {
        println!("* set at run time (--weight TENANT=default returns it to the config's)");
    }
}
