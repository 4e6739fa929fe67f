//! `delayd adopt`: moves what the delayed-message plugin holds into an
//! intake business, node by node, or counts it (`--dry-run`); and the
//! two-step form for a delayd that cannot reach rabbitmqctl
//! (`--print-export`, then `--from FILE`).

use std::path::PathBuf;

use super::{redis_conn, ConfigArg, Failure};
use crate::adopt::ctl::Ctl;
use crate::adopt::erlang::{self, Exchange, Limits};
use crate::adopt::lines::{self, Held};
use crate::adopt::{self as adoption, moving, staging, Adoption, NodeReport};
use crate::config::{self, Business, Config};
use crate::progress::Progress;
use crate::store::incoming::Writer;
use crate::text::utc_ms;

/// Arguments of `delayd adopt`.
#[derive(Debug, clap::Args)]
pub(super) struct AdoptArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The business the messages move into: one with an intake.
    #[arg(long)]
    business: String,
    /// The plugin's exchange (default: the business's intake exchange).
    #[arg(long)]
    exchange: Option<String>,
    /// The exchange's virtual host.
    #[arg(long, default_value = "/")]
    vhost: String,
    /// A node of the broker, as rabbitmqctl names it (rabbit@host); repeat
    /// for each node of a cluster: each holds its own backlog.
    #[arg(long = "node", value_name = "NODE")]
    nodes: Vec<String>,
    /// The command that reaches the nodes, with its arguments (split at
    /// spaces); delayd appends `-n NODE eval EXPRESSION`.
    #[arg(long, value_name = "CMD", default_value = "rabbitmqctl")]
    rabbitmqctl: String,
    /// Only count what each node holds, per exchange; move nothing.
    #[arg(long)]
    dry_run: bool,
    /// Messages per chunk: the plugin is held while one chunk moves.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    chunk: usize,
    /// Two-step form: print the Erlang expression that writes the
    /// exchange's messages on one node to BROKER_FILE on the broker host.
    #[arg(long, value_name = "BROKER_FILE", conflicts_with_all = ["from", "dry_run"])]
    print_export: Option<String>,
    /// Two-step form: messages due within this time after the export stay
    /// with the plugin; the delete expression must run before it is over.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    margin: String,
    /// Two-step form: take in an export file, then print the Erlang
    /// expression that deletes exactly what was taken in.
    #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
    from: Option<PathBuf>,
}

/// Most message bytes in one chunk.
const CHUNK_BYTES: usize = 8 << 20;

/// Runs `delayd adopt`.
pub(super) async fn run(a: AdoptArgs) -> Result<(), Failure> {
    let cfg = config::load(&a.config.config)?;
    let b = cfg.business(&a.business).map_err(Failure::usage)?;
    let settings = b.intake.as_ref().ok_or_else(|| {
        Failure::usage(format!(
            "business \"{}\" has no intake: adopt moves the plugin's messages into an intake business (add [businesses.{}.intake] with the exchange producers publish to)",
            b.name, b.name
        ))
    })?;
    if a.chunk == 0 {
        return Err(Failure::usage("--chunk must be at least 1"));
    }
    let exchange = Exchange {
        vhost: a.vhost.clone(),
        name: a
            .exchange
            .clone()
            .unwrap_or_else(|| settings.exchange.clone()),
    };
    if let Some(path) = &a.print_export {
        let margin = humantime::parse_duration(&a.margin)
            .map_err(|e| Failure::usage(format!("--margin \"{}\": {e}", a.margin)))?;
        print!(
            "{}",
            erlang::export(&exchange, path, margin.as_millis() as u64)
        );
        return Ok(());
    }
    let conn = redis_conn(&cfg).await?;
    let writer = Writer::new(conn, b);
    if let Some(file) = &a.from {
        return take_in(&cfg, b, &exchange, writer, file).await;
    }
    if a.nodes.is_empty() {
        return Err(Failure::usage(
            "name each node of the broker with --node (rabbit@host): each holds its own backlog",
        ));
    }
    let ctl = Ctl::new(&a.rabbitmqctl)
        .ok_or_else(|| Failure::usage("--rabbitmqctl must name a command"))?;
    if a.dry_run {
        return dry_run(&ctl, &a.nodes, &exchange).await;
    }
    let own_user = crate::amqp::login_user(&cfg.amqp);
    let adoption = Adoption {
        business: b,
        settings,
        own_user: own_user.as_deref(),
        exchange,
        ctl,
        limits: Limits {
            entries: a.chunk,
            bytes: CHUNK_BYTES,
            scan: a.chunk.saturating_mul(10).max(10_000),
        },
        writer,
        progress: Progress::new(&format!("adopt into \"{}\"", b.name), None),
    };
    let mut failed = false;
    for node in &a.nodes {
        let report = adoption.node(node).await;
        let report = report.map_err(|e| Failure::runtime(e.to_string()))?;
        failed |= !print_report(&adoption, &report);
    }
    adoption.progress.finish();
    if failed {
        return Err(Failure::status(1));
    }
    Ok(())
}

/// Prints one node's summary line (and what needs attention); false when
/// messages of the exchange stay with the plugin.
fn print_report(adoption: &Adoption<'_>, r: &NodeReport) -> bool {
    if !r.tables {
        println!(
            "node {}: no delayed-message tables (the plugin is not enabled there): nothing to move",
            r.node
        );
        return true;
    }
    let left: u64 = r.others.iter().map(|h| h.count).sum();
    let list: Vec<String> = r
        .others
        .iter()
        .map(|h| format!("{} {}: {}", h.vhost, h.name, h.count))
        .collect();
    let list = if list.is_empty() {
        String::new()
    } else {
        format!(" ({})", list.join(", "))
    };
    println!(
        "node {}: moved {} into business \"{}\", already there {}, left {} for other exchanges{}",
        r.node, r.moved, adoption.business.name, r.already, left, list
    );
    if r.by_plugin > 0 {
        println!(
            "node {}: {} messages read from the plugin were delivered by the plugin itself before delayd deleted them (it ran again: a broker restart, or a resume by hand): delayd dropped its copies, so each went out once",
            r.node, r.by_plugin
        );
    }
    if r.still_published {
        println!(
            "node {}: producers still publish to \"{}\" there: point them at the intake, then run adopt again",
            r.node, adoption.exchange.name
        );
    }
    for why in &r.unmovable {
        println!(
            "node {}: left with the plugin, delayd cannot carry it: {why}",
            r.node
        );
    }
    r.unmovable.is_empty()
}

/// `--dry-run`: per node and exchange, messages, bytes, earliest and
/// latest due time.
async fn dry_run(ctl: &Ctl, nodes: &[String], exchange: &Exchange) -> Result<(), Failure> {
    for node in nodes {
        let c = adoption::survey(ctl, node, exchange)
            .await
            .map_err(|e| Failure::runtime(e.to_string()))?;
        if !c.tables {
            println!("node {}: no delayed-message tables", c.node);
            continue;
        }
        if c.held_by.is_empty() {
            println!("node {}: the plugin holds nothing", c.node);
        }
        for h in &c.held_by {
            let ours = h.vhost == exchange.vhost && h.name == exchange.name;
            println!(
                "node {}: exchange {} {}: {} messages, {} bytes, due {} to {}{}",
                c.node,
                h.vhost,
                h.name,
                h.count,
                h.bytes,
                utc_ms(h.earliest_ms),
                utc_ms(h.latest_ms),
                if ours { " (would move)" } else { " (stays)" }
            );
        }
    }
    Ok(())
}

/// `--from FILE`: stores what an export file holds, then prints the
/// expression that deletes exactly that from the plugin.
async fn take_in(
    cfg: &Config,
    b: &Business,
    exchange: &Exchange,
    writer: Writer,
    file: &PathBuf,
) -> Result<(), Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    let chunk = lines::chunk(&text).map_err(|e| {
        Failure::usage(format!(
            "{}: not a complete export of `delayd adopt --print-export`: {e}",
            file.display()
        ))
    })?;
    let settings = b.intake.as_ref().expect("checked by the caller");
    let own_user = crate::amqp::login_user(&cfg.amqp);
    let mut batch = Vec::new();
    let mut items: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
    let mut unmovable = 0;
    for e in &chunk.entries {
        match moving::prepare(&chunk.node, e, settings, own_user.as_deref()) {
            Ok(m) => {
                batch.push(m);
                items.entry(e.due_ms).or_default().push(e.reference.clone());
            }
            Err(why) => {
                unmovable += 1;
                eprintln!(
                    "left with the plugin, delayd cannot carry it: due {}: {why}",
                    utc_ms(e.due_ms)
                );
            }
        }
    }
    let (mut stored, mut already) = (0, 0);
    let what = format!("take in \"{}\"", b.name);
    let progress = Progress::new(&what, Some(batch.len() as u64));
    let failed = |e| Failure::runtime(format!("redis: {e} (nothing is lost: rerun adopt --from)"));
    // Nothing deletes these from the plugin until the operator runs the
    // printed expression, so each part is promoted as soon as it is staged.
    for part in batch.chunks(2000) {
        already += staging::stage(&writer, part).await.map_err(failed)?;
        let done = staging::settle(&writer, b, part, &Default::default())
            .await
            .map_err(failed)?;
        stored += done.promoted;
        progress.add(part.len() as u64);
    }
    progress.finish();
    let ours = |h: &&Held| h.vhost == exchange.vhost && h.name == exchange.name;
    let left: u64 = chunk
        .held_by
        .iter()
        .filter(|h| !ours(h))
        .map(|h| h.count)
        .sum();
    let held: u64 = chunk.held_by.iter().filter(ours).map(|h| h.count).sum();
    let soon = held.saturating_sub(chunk.entries.len() as u64);
    eprintln!(
        "node {}: took in {} into business \"{}\", already there {}, left {soon} due within the margin (the plugin delivers them) and {left} for other exchanges; now save the expression printed on stdout to a file and run it on that node (rabbitmqctl -n {} eval_file FILE) to delete what was taken in from the plugin",
        chunk.node, stored, b.name, already, chunk.node
    );
    let items: Vec<(i64, Vec<String>)> = items.into_iter().collect();
    print!("{}", erlang::commit(exchange, &items, false, true));
    if unmovable > 0 {
        return Err(Failure::status(1));
    }
    Ok(())
}
