//! Adoption: moving the messages a running RabbitMQ delayed-message plugin
//! holds into an intake business, on every node (each node keeps its own
//! backlog in two Mnesia tables), so that each is delivered exactly once,
//! by the plugin or by delayd.
//!
//! A node is emptied chunk by chunk: [`erlang::read`] suspends the plugin's
//! process (no timer fires, no publish is stored) and prints one chunk; the
//! chunk is written to Redis, each message with a record of the plugin entry
//! it came from (`{K}:adopted`), and the replica wait the intake uses;
//! [`erlang::commit`] then deletes exactly those entries and resumes the
//! plugin. A crash anywhere leaves the plugin suspended with the chunk
//! still in it, and a rerun reads it again, finds the records and skips what
//! is already in Redis (delivered or not) before deleting it.
//!
//! - [`erlang`]: the expressions (`src/adopt/*.erl`);
//! - [`lines`]: what they print, parsed;
//! - [`ctl`]: `rabbitmqctl eval` on a node;
//! - [`moving`]: plugin entries to stored messages (`src/lua/adopt.lua`).

pub mod ctl;
pub mod erlang;
pub mod lines;
pub mod moving;

use std::collections::BTreeMap;

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
    /// Entries of a chunk the commit did not find, or committed after the
    /// plugin had been resumed behind delayd's back (a broker restart):
    /// the plugin may have delivered them too.
    pub doubtful: u64,
    /// Whether the last pass still found new messages of the exchange.
    pub still_published: bool,
    /// Whether the plugin was suspended when this run first read the node
    /// (an interrupted run left it so); `None` before that read.
    pub left_held: Option<bool>,
    /// Messages found in Redis already (an interrupted run stored them)
    /// while the plugin was not left held: it ran with them since (a
    /// broker restart, or a resume by hand), and those of that run's chunk
    /// that fell due meanwhile went out through it as well.
    pub ran_with_stored: u64,
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
    /// still in it.
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
            let (found, others) = self.pass(node, &mut report).await?;
            report.others = others;
            report.still_published = pass == PASSES - 1 && found > 0;
            if found == 0 || !report.tables {
                break;
            }
        }
        Ok(report)
    }

    /// One walk over the node's whole index: the entries of the exchange it
    /// moved, and what other exchanges hold.
    async fn pass(
        &self,
        node: &str,
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
            if report.left_held.is_none() && chunk.held {
                report.left_held = Some(chunk.suspended_before);
            }
            if !chunk.tables {
                report.tables = false;
                return Ok((0, Vec::new()));
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

    /// Stores one chunk, then deletes what is stored from the plugin and
    /// resumes it; on a Redis failure only resumes it. Returns the entries
    /// it took from the plugin (what it cannot carry stays there).
    async fn move_chunk(
        &self,
        node: &str,
        chunk: &Chunk,
        report: &mut NodeReport,
    ) -> Result<usize, AdoptError> {
        let mut batch = Vec::with_capacity(chunk.entries.len());
        let mut by_time: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for t in &chunk.orphans {
            by_time.entry(*t).or_default();
        }
        for e in &chunk.entries {
            match moving::prepare(&chunk.node, e, self.settings, self.own_user) {
                Ok(m) => {
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
            match moving::store(&self.writer, self.business, &batch).await {
                Ok(m) => {
                    report.moved += m.stored;
                    report.already += m.already;
                    if report.left_held == Some(false) {
                        report.ran_with_stored += m.already;
                    }
                    self.progress.add(m.stored + m.already);
                }
                Err(error) => {
                    // Release the plugin with the chunk still in it.
                    let _ = self
                        .ctl
                        .eval(node, &erlang::commit(&self.exchange, &[], true))
                        .await;
                    return Err(AdoptError::Redis {
                        node: node.to_string(),
                        error,
                    });
                }
            }
        }
        let items: Vec<(i64, Vec<String>)> = by_time.into_iter().collect();
        let mut was_held = true;
        let mut deleted = 0;
        let calls = erlang::commit_calls(
            &self.exchange,
            &items,
            true,
            ctl::MAX_ARGUMENT,
            ctl::MAX_ARGUMENTS - ctl::MAX_ARGUMENT,
        );
        for (i, (expr, values)) in calls.iter().enumerate() {
            let out = self.ctl.eval_with(node, expr, values).await?;
            let done = lines::committed(&out).map_err(|error| AdoptError::Output {
                node: node.to_string(),
                error,
            })?;
            report.doubtful += done.missing;
            deleted += done.deleted;
            if i == 0 {
                was_held = done.was_held;
            }
        }
        if chunk.held && !was_held {
            report.doubtful += deleted;
            tracing::warn!(node, "the plugin was resumed while delayd held it (a broker restart?): messages of this chunk that fell due meanwhile may be delivered twice");
        }
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
