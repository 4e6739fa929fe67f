//! The Redis side of moving a chunk, in two writes around the plugin's
//! delete, so that each message goes out through exactly one of the two:
//!
//! 1. [`stage`]: the messages go into `{K}:staged`, where nothing delivers
//!    them;
//! 2. the plugin's entries are deleted (commit.erl records their refs on the
//!    node's disk first);
//! 3. [`settle`]: those the delete removed become pending (with their
//!    `{K}:adopted` records) and those it no longer found (the plugin
//!    delivered them itself, after a broker restart) are dropped.
//!
//! A crash leaves at most a chunk staged per node. A rerun first asks the
//! node where each of its [`leftovers`] is (check.erl): one still in the
//! plugin stays staged and is moved again; one the record names was
//! deleted by the crashed run, so it is promoted; one in neither was
//! delivered by the plugin, so it is dropped.
//!
//! Each write goes through the intake's writer, so its replica wait applies.

use std::collections::{BTreeMap, HashSet};

use crate::config::Business;
use crate::keys::shard_of;
use crate::redis_conn::scripts;
use crate::store::incoming::{WriteError, Writer};
use crate::store::KeyFamily;

use super::moving::Moving;

/// How long `{K}:adopted` outlives the last adoption into K: beyond the
/// plugin's longest delay (2^32 − 1 ms, 49.7 days), so a rerun at any time
/// an entry could still be in the plugin knows it was moved. The staging
/// keys are kept as long, for a rerun long after a crash.
const KEEP_MS: u64 = 60 * 24 * 3600 * 1000;

/// What settling did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Made pending.
    pub promoted: u64,
    /// Dropped: the plugin delivered them.
    pub dropped: u64,
}

/// A staged entry a rerun did not find in the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The business key whose staging holds it.
    pub key: String,
    /// The entry's name.
    pub name: String,
    /// Its due time, epoch ms (the plugin's timestamp).
    pub due_ms: i64,
    /// Its ref, as read.erl printed it.
    pub reference: String,
}

/// An `EVALSHA` of `script` with `keys`; its other arguments follow.
fn evalsha(script: &redis::Script, keys: &[&String]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// Stages `batch`, each message on the shard of its id. Returns how many
/// an earlier run had moved already (recorded in `{K}:adopted`): those are
/// not staged again.
pub async fn stage(writer: &Writer, batch: &[Moving]) -> Result<u64, WriteError> {
    let mut already = 0;
    for (key, mine) in by_shard(writer.keys(), batch) {
        let f = KeyFamily::new(key);
        let mut cmd = evalsha(&scripts::ADOPT_STAGE, &[&f.staged, &f.adopted]);
        cmd.arg(KEEP_MS);
        for m in mine {
            cmd.arg(&m.name).arg(pack(m));
        }
        let (_, _, seen) = writer.run(cmd).await?;
        already += seen;
    }
    Ok(already)
}

/// Promotes the staged entries of `batch` whose names are not in `gone`,
/// and drops those that are.
pub async fn settle(
    writer: &Writer,
    business: &Business,
    batch: &[Moving],
    gone: &HashSet<String>,
) -> Result<Settled, WriteError> {
    let keys = writer.keys();
    let each = batch.iter().map(|m| {
        (
            shard_of(keys, &m.id),
            m.name.as_str(),
            !gone.contains(&m.name),
        )
    });
    settle_each(writer, business, each).await
}

/// Promotes (`true`) or drops (`false`) each staged entry, named with the
/// key whose staging holds it: one `adopt_promote.lua` call per key.
pub async fn settle_each<'a>(
    writer: &Writer,
    business: &Business,
    each: impl IntoIterator<Item = (&'a str, &'a str, bool)>,
) -> Result<Settled, WriteError> {
    let mut names: BTreeMap<&str, (Vec<&str>, Vec<&str>)> = BTreeMap::new();
    for (key, name, promote) in each {
        let (promoted, dropped) = names.entry(key).or_default();
        if promote {
            promoted.push(name);
        } else {
            dropped.push(name);
        }
    }
    let mut done = Settled::default();
    for (key, (promote, drop)) in names {
        let f = KeyFamily::new(key);
        let keys = [&f.pending, &f.body, &f.adopted, &f.staged];
        let mut cmd = evalsha(&scripts::ADOPT_PROMOTE, &keys);
        cmd.arg(business.score_unit.millis())
            .arg(KEEP_MS)
            .arg(promote.len())
            .arg(&promote)
            .arg(&drop);
        let (_, promoted, dropped) = writer.run(cmd).await?;
        done.promoted += promoted;
        done.dropped += dropped;
    }
    Ok(done)
}

/// The entries of `node` still staged in the business's keys (what an
/// interrupted run left and this run did not find in the plugin), read in
/// steps of 100.
pub async fn leftovers(writer: &Writer, node: &str) -> Result<Vec<Leftover>, WriteError> {
    let mut conn = writer.conn();
    let mut left = Vec::new();
    for key in writer.keys() {
        let f = KeyFamily::new(key);
        let mut cursor = 0u64;
        loop {
            let (next, pairs): (u64, Vec<(String, Vec<u8>)>) = redis::cmd("HSCAN")
                .arg(&f.staged)
                .arg(cursor)
                .arg("COUNT")
                .arg(100)
                .query_async(&mut conn)
                .await
                .map_err(crate::store::StoreError::from)?;
            for (name, packed) in pairs {
                if let Some((n, due_ms, reference)) = origin(&packed) {
                    if n == node.as_bytes() {
                        left.push(Leftover {
                            key: key.clone(),
                            name,
                            due_ms,
                            reference,
                        });
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(left)
}

/// `batch` grouped by the shard of each message's id.
fn by_shard<'a, 'k>(keys: &'k [String], batch: &'a [Moving]) -> BTreeMap<&'k str, Vec<&'a Moving>> {
    let mut out: BTreeMap<&str, Vec<&Moving>> = BTreeMap::new();
    for m in batch {
        out.entry(shard_of(keys, &m.id)).or_default().push(m);
    }
    out
}

/// What `{K}:staged` holds for `m`: `"<due ms> <id length> <node length>
/// <ref length> "`, then the id, the node, the ref and the envelope (read by
/// `adopt_promote.lua`).
fn pack(m: &Moving) -> Vec<u8> {
    let mut out = format!(
        "{} {} {} {} ",
        m.due_ms.max(0),
        m.id.len(),
        m.node.len(),
        m.reference.len()
    )
    .into_bytes();
    out.extend_from_slice(&m.id);
    out.extend_from_slice(m.node.as_bytes());
    out.extend_from_slice(m.reference.as_bytes());
    out.extend_from_slice(&m.envelope);
    out
}

/// Where a packed message came from: its node, due time and ref.
fn origin(packed: &[u8]) -> Option<(&[u8], i64, String)> {
    let mut fields = packed.splitn(5, |b| *b == b' ');
    let mut number = || -> Option<usize> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
    let due_ms = number()? as i64;
    let (id_len, node_len, ref_len) = (number()?, number()?, number()?);
    let rest = fields.next()?;
    let node = rest.get(id_len..id_len.checked_add(node_len)?)?;
    let at = id_len + node_len;
    let reference = rest.get(at..at.checked_add(ref_len)?)?;
    Some((node, due_ms, String::from_utf8(reference.to_vec()).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_message_names_its_node_due_time_and_ref_whatever_its_id_holds() {
        let m = Moving {
            name: "n".into(),
            id: b"a b\n7 8 ".to_vec(),
            node: "rabbit@host".into(),
            reference: "g1oAAw==".into(),
            due_ms: 1_800_000_000_000,
            envelope: b"\x00 env".to_vec(),
        };
        let p = pack(&m);
        assert!(p.starts_with(b"1800000000000 8 11 8 a b\n7 8 rabbit@hostg1oAAw=="));
        assert!(p.ends_with(b"\x00 env"));
        let (node, due, reference) = origin(&p).unwrap();
        assert_eq!(node, b"rabbit@host");
        assert_eq!(due, 1_800_000_000_000);
        assert_eq!(reference, "g1oAAw==");
        assert_eq!(origin(b"1 2 3 4 ab"), None);
        assert_eq!(origin(b"junk"), None);
    }
}
