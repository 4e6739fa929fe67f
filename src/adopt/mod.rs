//! Adoption: moving the messages a running RabbitMQ delayed-message plugin
//! holds into an intake business, on every node (each node keeps its own
//! backlog in two Mnesia tables), so that each is delivered exactly once,
//! by the plugin or by delayd.
//!
//! A node is emptied chunk by chunk: [`erlang::read`] suspends the plugin's
//! process (no timer fires, no publish is stored) and prints one chunk; the
//! chunk is staged in Redis, where nothing delivers it; [`erlang::commit`]
//! records the chunk's refs on the node's disk, deletes exactly those
//! entries and resumes the plugin; then what it deleted becomes pending,
//! each message with a record of the plugin entry it came from
//! (`{K}:adopted`). Each write has the intake's replica wait. A crash
//! anywhere leaves the chunk staged and, unless the broker restarts, the
//! plugin suspended with the chunk still in it; a rerun settles what is
//! staged by where the node says each entry is ([`staging`]), then moves
//! the rest.
//!
//! - [`erlang`]: the expressions (`src/adopt/*.erl`);
//! - [`lines`]: what they print, parsed;
//! - [`ctl`]: `rabbitmqctl eval` on a node;
//! - [`moving`]: plugin entries to stored messages;
//! - [`staging`]: the Redis side (`src/lua/adopt_*.lua`).

pub mod ctl;
pub mod erlang;
pub mod lines;
pub mod moving;
pub mod staging;

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::config::intake_settings::Settings;
use crate::config::Business;
use crate::progress::Progress;
use crate::store::incoming::Writer;

use ctl::Ctl;
use erlang::{Exchange, Limits};
use lines::{Chunk, Held};

/// Passes over a node's index at most: the second picks up what producers
/// published to the plugin while the first ran; a third that still finds
/// new messages means they publish there still.
const PASSES: usize = 3;

/// Everything a run needs besides the nodes.
pub struct Adoption<'a> {
    /// The business the messages move into.
    pub business: &'a Business,
    /// Its intake settings (`x-delay`, `user_id`, the replica wait).
    pub settings: &'a Settings,
    /// The user delayd publishes as, when known.
    pub own_user: Option<&'a str>,
    /// The plugin exchange to empty.
    pub exchange: Exchange,
    /// How delayd reaches the nodes.
    pub ctl: Ctl,
    /// How much one chunk holds.
    pub limits: Limits,
    /// The writer for the business's keys.
    pub writer: Writer,
    /// Counts the messages stored, on a terminal.
    pub progress: Progress,
}

/// What one node ended with.
#[derive(Debug, Default, Clone)]
pub struct NodeReport {
    /// The node's own name.
    pub node: String,
    /// Whether it has the plugin's tables.
    pub tables: bool,
    /// Messages stored in Redis and deleted from the plugin.
    pub moved: u64,
    /// Messages an earlier run had stored, deleted from the plugin now.
    pub already: u64,
    /// Messages of the exchange left with the plugin (in the last pass),
    /// each with why.
    pub unmovable: Vec<String>,
    /// Messages of other exchanges, left with the plugin.
    pub others: Vec<Held>,
    /// Staged messages whose plugin entries were gone when delayd went to
    /// delete them: the plugin delivered them itself (it ran again after a
    /// broker restart or a resume by hand), so delayd dropped them.
    pub by_plugin: u64,
    /// Whether the last pass still found new messages of the exchange.
    pub still_published: bool,
}

/// Why a node was not emptied.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// rabbitmqctl failed.
    #[error(transparent)]
    Ctl(#[from] ctl::CtlError),
    /// Its output could not be read.
    #[error("node {node}: {error}")]
    Output {
        /// The node.
        node: String,
        /// What was wrong.
        error: lines::LineError,
    },
    /// Redis did not store a chunk; the plugin was resumed with the chunk
    /// still in it (or, after its delete, a rerun settles it).
    #[error("node {node}: Redis did not store a chunk (the plugin keeps it; rerun once Redis is back): {error}")]
    Redis {
        /// The node.
        node: String,
        /// What Redis said.
        error: crate::store::incoming::WriteError,
    },
}

impl Adoption<'_> {
    /// Empties the exchange on `node`, chunk by chunk.
    pub async fn node(&self, node: &str) -> Result<NodeReport, AdoptError> {
        let mut report = NodeReport {
            node: node.to_string(),
            tables: true,
            ..NodeReport::default()
        };
        for pass in 0..PASSES {
            report.unmovable.clear();
            let (found, others) = self.pass(node, pass == 0, &mut report).await?;
            report.others = others;
            report.still_published = pass == PASSES - 1 && found > 0;
            if found == 0 || !report.tables {
                break;
            }
        }
        Ok(report)
    }

    /// Settles what an interrupted run left staged for this node, before
    /// any commit of this run replaces the node's record of what that run
    /// deleted: promotes what it deleted, drops what the plugin delivered,
    /// and leaves staged what the plugin still holds (this run moves it).
    /// `name` is the node's own name, as its reads print it.
    async fn settle_leftovers(
        &self,
        node: &str,
        name: &str,
        report: &mut NodeReport,
    ) -> Result<(), AdoptError> {
        let redis = |error| AdoptError::Redis {
            node: node.to_string(),
            error,
        };
        let left = staging::leftovers(&self.writer, name)
            .await
            .map_err(redis)?;
        if left.is_empty() {
            return Ok(());
        }
        let mut by_time: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for l in &left {
            by_time
                .entry(l.due_ms)
                .or_default()
                .push(l.reference.clone());
        }
        let items: Vec<(i64, Vec<String>)> = by_time.into_iter().collect();
        let mut present = HashSet::new();
        let mut deleted = HashSet::new();
        for (expr, values) in erlang::check_calls(
            &self.exchange,
            &items,
            ctl::MAX_ARGUMENT,
            ctl::MAX_ARGUMENTS - ctl::MAX_ARGUMENT,
        ) {
            let out = self.ctl.eval_with(node, &expr, &values).await?;
            let c = lines::checked(&out).map_err(|error| AdoptError::Output {
                node: node.to_string(),
                error,
            })?;
            present.extend(c.present);
            deleted.extend(c.deleted);
        }
        // Deleted: promote; still in the plugin: leave; neither: drop.
        let each = left.iter().filter_map(|l| {
            let at = (l.due_ms, l.reference.clone());
            let deleted = deleted.contains(&at);
            (deleted || !present.contains(&at)).then_some((
                l.key.as_str(),
                l.name.as_str(),
                deleted,
            ))
        });
        let done = staging::settle_each(&self.writer, self.business, each)
            .await
            .map_err(redis)?;
        report.moved += done.promoted;
        report.by_plugin += done.dropped;
        Ok(())
    }

    /// One walk over the node's whole index: the entries of the exchange it
    /// moved, and what other exchanges hold. The `first` pass settles what
    /// an interrupted run left staged once its first read names the node.
    async fn pass(
        &self,
        node: &str,
        first: bool,
        report: &mut NodeReport,
    ) -> Result<(u64, Vec<Held>), AdoptError> {
        let mut cursor: Option<String> = None;
        let mut found = 0;
        let mut others: BTreeMap<(String, String), Held> = BTreeMap::new();
        loop {
            let expr = erlang::read(&self.exchange, true, self.limits, cursor.as_deref());
            let out = self.ctl.eval(node, &expr).await?;
            let chunk = lines::chunk(&out).map_err(|error| AdoptError::Output {
                node: node.to_string(),
                error,
            })?;
            if !chunk.node.is_empty() {
                report.node = chunk.node.clone();
            }
            if !chunk.tables {
                report.tables = false;
                return Ok((0, Vec::new()));
            }
            if first && cursor.is_none() {
                self.settle_leftovers(node, &chunk.node, report).await?;
            }
            for h in chunk.held_by.iter().filter(|h| !self.is_ours(h)) {
                merge(&mut others, h);
            }
            found += self.move_chunk(node, &chunk, report).await? as u64;
            match chunk.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok((found, others.into_values().collect()))
    }

    /// Stages one chunk, deletes it from the plugin and resumes the plugin,
    /// then settles the chunk; on a Redis failure before the delete only
    /// resumes the plugin. Returns the entries it took from the plugin
    /// (what it cannot carry stays there).
    async fn move_chunk(
        &self,
        node: &str,
        chunk: &Chunk,
        report: &mut NodeReport,
    ) -> Result<usize, AdoptError> {
        let mut batch = Vec::with_capacity(chunk.entries.len());
        let mut by_time: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        // The commit names what it did not find by due time and ref.
        let mut names: HashMap<(i64, &str), String> = HashMap::new();
        for t in &chunk.orphans {
            by_time.entry(*t).or_default();
        }
        for e in &chunk.entries {
            match moving::prepare(&chunk.node, e, self.settings, self.own_user) {
                Ok(m) => {
                    names.insert((e.due_ms, e.reference.as_str()), m.name.clone());
                    batch.push(m);
                    by_time
                        .entry(e.due_ms)
                        .or_default()
                        .push(e.reference.clone());
                }
                Err(why) => report
                    .unmovable
                    .push(format!("due {}: {why}", crate::text::utc_ms(e.due_ms))),
            }
        }
        if !batch.is_empty() {
            match staging::stage(&self.writer, &batch).await {
                Ok(already) => report.already += already,
                Err(error) => {
                    // Release the plugin with the chunk still in it.
                    let _ = self
                        .ctl
                        .eval(node, &erlang::commit(&self.exchange, &[], true, false))
                        .await;
                    return Err(AdoptError::Redis {
                        node: node.to_string(),
                        error,
                    });
                }
            }
        }
        let items: Vec<(i64, Vec<String>)> = by_time.into_iter().collect();
        let calls = erlang::commit_calls(
            &self.exchange,
            &items,
            true,
            ctl::MAX_ARGUMENT,
            ctl::MAX_ARGUMENTS - ctl::MAX_ARGUMENT,
        );
        let mut gone = HashSet::new();
        for (expr, values) in &calls {
            let out = self.ctl.eval_with(node, expr, values).await?;
            let done = lines::committed(&out).map_err(|error| AdoptError::Output {
                node: node.to_string(),
                error,
            })?;
            gone.extend(
                done.gone
                    .iter()
                    .filter_map(|(t, r)| names.get(&(*t, r.as_str())).cloned()),
            );
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let done = staging::settle(&self.writer, self.business, &batch, &gone)
            .await
            .map_err(|error| AdoptError::Redis {
                node: node.to_string(),
                error,
            })?;
        report.moved += done.promoted;
        report.by_plugin += done.dropped;
        if done.dropped > 0 {
            tracing::warn!(node, dropped = done.dropped, "the plugin ran again while delayd held it (a broker restart?) and delivered messages of this chunk itself: delayd dropped its copies");
        }
        self.progress.add(batch.len() as u64);
        Ok(batch.len())
    }

    fn is_ours(&self, h: &Held) -> bool {
        h.vhost == self.exchange.vhost && h.name == self.exchange.name
    }
}

/// Adds `h` to the totals per exchange.
pub fn merge(totals: &mut BTreeMap<(String, String), Held>, h: &Held) {
    totals
        .entry((h.vhost.clone(), h.name.clone()))
        .and_modify(|t| {
            t.count += h.count;
            t.bytes += h.bytes;
            t.earliest_ms = t.earliest_ms.min(h.earliest_ms);
            t.latest_ms = t.latest_ms.max(h.latest_ms);
        })
        .or_insert_with(|| h.clone());
}

/// What `--dry-run` shows of one node: what each exchange holds there.
pub async fn survey(ctl: &Ctl, node: &str, exchange: &Exchange) -> Result<Chunk, AdoptError> {
    let out = ctl.eval(node, &erlang::survey(exchange)).await?;
    lines::chunk(&out).map_err(|error| AdoptError::Output {
        node: node.to_string(),
        error,
    })
}
