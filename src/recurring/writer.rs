//! The task that writes a business's schedule occurrences ahead.
//!
//! Each pass reads the schedules' state from Redis (`{K}:schedules`: how
//! far each is handled), works out the occurrences up to `write_ahead`
//! and, for occurrences missed while no instance ran, what the catch-up
//! policy keeps; then one `recurring.lua` call writes them, each as an
//! id-mode member `SCHEDULE@<epoch ms>` of the business's first key. The
//! call applies a schedule's part only if its state is still what this pass
//! read, so with any number of instances each occurrence is written once.

use crate::redis_conn::scripts;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::occurrences::between;
use crate::config::recurring_section::{CatchUp, Schedule};
use crate::config::Business;
use crate::keys::KeyFamily;
use crate::redis_conn::RedisConn;
use crate::store::{Claimed, StoreError};
use crate::telemetry::{Backoff, METRICS};

/// An occurrence at most this far in the past when its pass comes (at least
/// 2 s, at most 10 s, as long as `write_ahead` within that) is written
/// whatever the catch-up policy: a pass late by one interval is not an
/// outage.
fn grace_ms(s: &Schedule) -> i64 {
    (s.write_ahead.as_millis() as i64).clamp(2_000, 10_000)
}
/// Longest sleep between passes: a pass costs `TIME`, one `HGETALL` (which
/// also reads each schedule's pause, so pausing costs no command) and one
/// script call, so an idle business with schedules costs 0.3 calls per
/// second.
const MAX_SLEEP: Duration = Duration::from_secs(10);
/// Most occurrences one schedule writes in a pass.
const MAX_PER_PASS: usize = 1000;
/// Most missed occurrences counted for one schedule after an outage.
const MAX_MISSED: usize = 100_000;

/// One schedule's part of a pass.
struct Group {
    op: &'static str,
    name: String,
    expected: String,
    state: String,
    /// (id, due ms, body)
    occurrences: Vec<(String, i64, Vec<u8>)>,
    /// Missed occurrences the catch-up policy skips.
    missed: u64,
}

/// Writes the occurrences of one business's schedules.
pub struct Writer {
    business: Arc<Business>,
    conn: RedisConn,
    keys: KeyFamily,
}

impl Writer {
    /// The writer of `business`'s schedules over a shared connection.
    pub fn new(business: Arc<Business>, conn: RedisConn) -> Self {
        let key = business.keys().into_iter().next().unwrap_or_default();
        Self {
            keys: KeyFamily::new(&key),
            business,
            conn,
        }
    }

    /// Writes until `stop`: the first pass also forgets schedules that are
    /// no longer configured.
    pub async fn run(self, stop: CancellationToken) {
        let mut first = true;
        let mut backoff = Backoff::new(Duration::from_millis(500), MAX_SLEEP);
        let mut failing = false;
        loop {
            let sleep = match self.pass(first).await {
                Ok(next) => {
                    first = false;
                    failing = false;
                    backoff.reset();
                    next
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(business = %self.business.name, error = %e, "cannot write recurring occurrences; retrying (occurrences already written are delivered meanwhile)");
                        failing = true;
                    }
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// One pass; returns how long to wait before the next.
    async fn pass(&self, first: bool) -> Result<Duration, StoreError> {
        let mut conn = self.conn.clone();
        let now = crate::tasks::redis_now_ms(&mut conn).await?;
        let state: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&self.keys.schedules)
            .query_async(&mut conn)
            .await?;
        let mut groups = Vec::new();
        if first {
            for (name, value) in &state {
                let configured = self.business.recurring.iter().any(|s| &s.name == name);
                if !configured && !super::notes::is_note(name) {
                    groups.push(Group {
                        op: "remove",
                        name: name.clone(),
                        expected: value.clone(),
                        state: String::new(),
                        occurrences: Vec::new(),
                        missed: 0,
                    });
                }
            }
        }
        for s in &self.business.recurring {
            let paused = state.contains_key(&super::notes::paused_field(&s.name));
            groups.push(self.plan(s, state.get(&s.name), now, paused));
        }
        let mut inv = scripts::RECURRING.prepare_invoke();
        inv.key(&self.keys.pending)
            .key(&self.keys.body)
            .key(&self.keys.schedules)
            .key(&self.keys.occurrences)
            .arg(self.business.score_unit.millis());
        for g in &groups {
            inv.arg(g.op)
                .arg(&g.name)
                .arg(&g.expected)
                .arg(&g.state)
                .arg(g.missed)
                .arg(g.occurrences.len());
            for (id, due, body) in &g.occurrences {
                inv.arg(id).arg(*due).arg(body.as_slice());
            }
        }
        let results: Vec<(i64, i64)> = inv.invoke_async(&mut conn).await?;
        for (g, (written, forgotten)) in groups.iter().zip(results) {
            self.report(g, written, forgotten);
        }
        Ok(self.next_pass_in(now))
    }

    /// What one schedule writes in a pass whose clock reads `now`, given its
    /// stored state: nothing while it is paused (handled up to now, so its
    /// resume neither catches up nor misses what fell in the pause).
    fn plan(&self, s: &Schedule, stored: Option<&String>, now: i64, paused: bool) -> Group {
        let fingerprint = s.fingerprint();
        let until = now + s.write_ahead.as_millis() as i64;
        let grace = grace_ms(s);
        let handled = stored.and_then(|v| {
            let (fp, ms) = v.split_once(' ')?;
            Some((fp.to_string(), ms.parse::<i64>().ok()?))
        });
        let (op, from) = match &handled {
            Some((fp, ms)) if *fp == fingerprint => ("write", *ms),
            // A changed schedule starts afresh from now; a new one too,
            // with nothing to catch up.
            Some(_) => ("replace", now),
            None => ("write", now),
        };
        if paused {
            return Group {
                op,
                name: s.name.clone(),
                expected: stored.cloned().unwrap_or_default(),
                state: format!("{fingerprint} {now}"),
                occurrences: Vec::new(),
                missed: 0,
            };
        }
        let mut due = Vec::new();
        let mut missed = 0;
        if from < now - grace {
            let past = between(s, from, now - grace, MAX_MISSED);
            let window_start = now - s.catch_up_window.as_millis() as i64;
            let in_window: Vec<i64> = past
                .iter()
                .copied()
                .filter(|t| *t >= window_start)
                .collect();
            let keep: Vec<i64> = match s.catch_up {
                CatchUp::None => Vec::new(),
                CatchUp::Last => in_window.last().copied().into_iter().collect(),
                CatchUp::All => in_window
                    .into_iter()
                    .rev()
                    .take(MAX_PER_PASS)
                    .rev()
                    .collect(),
            };
            missed = (past.len() - keep.len()) as u64;
            due.extend(keep);
        }
        let recent_from = from.max(now - grace);
        due.extend(between(s, recent_from, until, MAX_PER_PASS));
        // With more than a pass can write, the state says how far it got.
        let handled_to = if due.len() >= MAX_PER_PASS {
            *due.last().unwrap_or(&until)
        } else {
            until
        };
        Group {
            op,
            name: s.name.clone(),
            expected: stored.cloned().unwrap_or_default(),
            state: format!("{fingerprint} {handled_to}"),
            occurrences: due.into_iter().map(|t| self.occurrence(s, t)).collect(),
            missed,
        }
    }

    /// The id and body of `s`'s occurrence at `due` ms.
    fn occurrence(&self, s: &Schedule, due: i64) -> (String, i64, Vec<u8>) {
        let id = format!("{}@{due}", s.name);
        let body = body_of(&self.business, &self.keys, s, &id, due);
        (id, due, body)
    }

    fn report(&self, g: &Group, written: i64, forgotten: i64) {
        let b = &self.business.name;
        if written < 0 {
            return; // Another instance wrote this part first.
        }
        match g.op {
            "remove" => {
                tracing::info!(business = %b, schedule = %g.name, forgotten, "schedule no longer configured: its future occurrences are removed")
            }
            "replace" => {
                tracing::info!(business = %b, schedule = %g.name, forgotten, written, "schedule changed: its future occurrences are replaced")
            }
            _ => {}
        }
        if g.missed > 0 {
            METRICS
                .recurring_missed
                .with_label_values(&[b.as_str(), g.name.as_str()])
                .inc_by(g.missed);
            tracing::warn!(business = %b, schedule = %g.name, missed = g.missed, "occurrences missed while no instance ran were skipped by the catch_up policy");
        }
    }

    /// Until the next pass: each occurrence is written at least half its
    /// schedule's `write_ahead` before it is due; at most [`MAX_SLEEP`].
    fn next_pass_in(&self, now: i64) -> Duration {
        let mut wait = MAX_SLEEP.as_millis() as i64;
        for s in &self.business.recurring {
            let ahead = s.write_ahead.as_millis() as i64;
            if let Some(t) = between(s, now + ahead, i64::MAX, 1).first() {
                wait = wait.min(t - now - ahead / 2);
            }
        }
        Duration::from_millis(wait.clamp(500, MAX_SLEEP.as_millis() as i64) as u64)
    }
}

/// What an occurrence `id` of `s` due at `due` ms stores: a plain body, or
/// an envelope that carries the schedule's own routing key.
pub fn body_of(business: &Business, keys: &KeyFamily, s: &Schedule, id: &str, due: i64) -> Vec<u8> {
    match &s.routing_key {
        None => s.body.clone(),
        Some(rk) => {
            let claimed = Claimed {
                member: id.as_bytes().to_vec(),
                due_ms: due,
                attempt: 1,
                body: Some(s.body.clone()),
                tenant: None,
            };
            let props = crate::message::properties(business, &keys.pending, &claimed, due);
            crate::message::envelope::encode(rk, &props, &s.body).unwrap_or_else(|_| s.body.clone())
        }
    }
}

/// Starts the writer of every business with schedules.
pub fn start(
    businesses: &[Arc<Business>],
    conn: &RedisConn,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    businesses
        .iter()
        .filter(|b| !b.recurring.is_empty())
        .map(|b| tokio::spawn(Writer::new(b.clone(), conn.clone()).run(stop.clone())))
        .collect()
}
