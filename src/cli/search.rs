//! `delayd search`: pending tasks whose member starts with a prefix, or in
//! id mode tasks whose body contains a text, a bounded page at a time.

use clap::Args;

use super::{redis_conn, ConfigArg, Failure};
use crate::config;
use crate::tasks::search;
use crate::text::escape_bytes;

/// Arguments of `delayd search`.
#[derive(Debug, Args)]
#[group(id = "what", required = true, multiple = false, args = ["prefix", "body"])]
pub(super) struct SearchArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business to search.
    business: String,
    /// Members (ids, or bodies in body mode) starting with this.
    #[arg(long)]
    prefix: Option<String>,
    /// Id mode: tasks whose body contains this text.
    #[arg(long)]
    body: Option<String>,
    /// Matches wanted on this page (a page may hold fewer).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Go on from the cursor the previous page printed.
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
    /// A business with tenants: only this tenant's tasks (with --prefix).
    #[arg(long, value_name = "TENANT", conflicts_with = "body")]
    tenant: Option<String>,
}

/// `delayd search`: prints `due_ms<TAB>member` (`-` when not pending, and
/// the body after the id for a body search), then the cursor on stderr.
pub(super) async fn run(a: SearchArgs) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    if a.limit == 0 || a.limit > 1000 {
        return Err(Failure::usage(format!(
            "--limit must be between 1 and 1000 (got {})",
            a.limit
        )));
    }
    if let Some(c) = a.cursor.as_deref().filter(|c| !search::valid_cursor(b, c)) {
        return Err(Failure::usage(format!(
            "--cursor \"{c}\" is not a cursor delayd search printed"
        )));
    }
    if let Some(t) = a
        .body
        .as_deref()
        .filter(|t| t.is_empty() || t.len() > search::MAX_TEXT)
    {
        return Err(Failure::usage(format!(
            "--body must be 1 to {} bytes of text to find (got {})",
            search::MAX_TEXT,
            t.len()
        )));
    }
    super::tenant_ok(b, a.tenant.as_deref())?;
    let mut conn = redis_conn(&cfg).await?;
    let redis = |e| Failure::runtime(format!("business \"{}\": redis: {e}", b.name));
    let cursor = match (&a.prefix, &a.body) {
        (_, Some(text)) => {
            if !b.member.is_id() {
                return Err(Failure::usage(format!(
                    "business \"{}\" has member = \"body\": search its members with --prefix",
                    b.name
                )));
            }
            let page = search::by_body(&mut conn, b, text.as_bytes(), a.limit, a.cursor.as_deref())
                .await
                .map_err(redis)?;
            for m in &page.found {
                let due = m.due_ms.map_or("-".to_string(), |d| d.to_string());
                // Bodies leave Redis cut to their start, as the API's do.
                let cut = if m.size > m.head.len() {
                    format!("… ({} bytes)", m.size)
                } else {
                    String::new()
                };
                println!(
                    "{due}\t{}\t{}{cut}",
                    escape_bytes(&m.id),
                    escape_bytes(&m.head)
                );
            }
            page.cursor
        }
        (prefix, None) => {
            let prefix = prefix.as_deref().unwrap_or("").as_bytes();
            let page = search::by_prefix(
                &mut conn,
                b,
                prefix,
                a.limit,
                a.cursor.as_deref(),
                a.tenant.as_deref(),
            )
            .await
            .map_err(redis)?;
            for t in &page.tasks {
                println!("{}\t{}", t.due_ms, t.member.escaped());
            }
            page.cursor
        }
    };
    match cursor {
        Some(c) => eprintln!("searched part of the set; go on with --cursor {c}"),
        None => eprintln!("searched to the end"),
    }
    Ok(())
}
