//! What the expressions print (and what an export file holds): lines
//! `delayd-adopt WORD FIELDS...`, binary fields in base64, so a body or a
//! header with any bytes (newlines, NULs, invalid UTF-8) stays on its line.
//! Lines without the prefix (rabbitmqctl's own output) are ignored; the
//! final `end` line proves the expression ran to its end.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

const PREFIX: &str = "delayd-adopt";

/// One message the plugin holds for the exchange being moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When it is due, epoch ms (the plugin's absolute timestamp).
    pub due_ms: i64,
    /// The entry's Erlang ref, as read.erl printed it: its identity in the
    /// plugin's bag, which commit.erl deletes by.
    pub reference: String,
    /// The first routing key it was published with.
    pub routing_key: Vec<u8>,
    /// Its AMQP 0-9-1 properties, in the content header's encoding.
    pub properties: Vec<u8>,
    /// Its body.
    pub body: Vec<u8>,
}

/// What one exchange holds in what a read visited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Its virtual host.
    pub vhost: String,
    /// Its name.
    pub name: String,
    /// Messages.
    pub count: u64,
    /// Bytes of properties and bodies.
    pub bytes: u64,
    /// The earliest due time, epoch ms.
    pub earliest_ms: i64,
    /// The latest due time, epoch ms.
    pub latest_ms: i64,
}

/// What one read printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The node's own name.
    pub node: String,
    /// Whether the node has the plugin's tables at all.
    pub tables: bool,
    /// Whether the plugin's process is now suspended.
    pub held: bool,
    /// The exchange's entries to move.
    pub entries: Vec<Entry>,
    /// Timestamps of the exchange's index keys left without entries.
    pub orphans: Vec<i64>,
    /// Counts per exchange over the keys visited.
    pub held_by: Vec<Held>,
    /// Where the next chunk starts; `None` once the index is read to its end.
    pub cursor: Option<String>,
}

/// What one commit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// Whether the plugin was still suspended when it ran.
    pub was_held: bool,
    /// Entries deleted.
    pub deleted: u64,
    /// Entries of the chunk not found.
    pub missing: u64,
    /// Those entries, each as (due time, ref as read.erl printed it).
    pub gone: Vec<(i64, String)>,
}

/// Where check.erl found the entries it was asked about; those in neither
/// list the plugin delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Still in the plugin: (due time, ref).
    pub present: Vec<(i64, String)>,
    /// Deleted by the last commit: (due time, ref).
    pub deleted: Vec<(i64, String)>,
}

/// Why a broker's output cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// It stopped before its `end` line: the expression failed.
    #[error("the broker's output ends before the expression finished")]
    Unfinished,
    /// A line that is not what the expression prints.
    #[error("line {0}: {1}")]
    Malformed(usize, String),
}

/// Reads what read.erl printed (or an export file holds).
pub fn chunk(text: &str) -> Result<Chunk, LineError> {
    let first = Chunk {
        tables: true,
        ..Chunk::default()
    };
    read(text, first, |c, fields| {
        match fields {
            ["node", node] => c.node = text_of(node).ok_or("node")?,
            ["notables"] => c.tables = false,
            ["held", h] => c.held = *h == "1",
            ["entry", ts, reference, rk, props, body] => c.entries.push(Entry {
                due_ms: ts.parse().map_err(|_| "timestamp")?,
                reference: reference.to_string(),
                routing_key: bytes(rk).ok_or("routing key")?,
                properties: bytes(props).ok_or("properties")?,
                body: bytes(body).ok_or("body")?,
            }),
            ["orphan", ts] => c.orphans.push(ts.parse().map_err(|_| "timestamp")?),
            ["stats", vhost, name, count, size, lo, hi] => c.held_by.push(Held {
                vhost: text_of(vhost).ok_or("vhost")?,
                name: text_of(name).ok_or("name")?,
                count: count.parse().map_err(|_| "count")?,
                bytes: size.parse().map_err(|_| "bytes")?,
                earliest_ms: lo.parse().map_err(|_| "earliest")?,
                latest_ms: hi.parse().map_err(|_| "latest")?,
            }),
            ["cursor", key] => c.cursor = Some(key.to_string()),
            ["done"] => c.cursor = None,
            _ => return Err("unknown line"),
        }
        Ok(())
    })
}

/// Reads what commit.erl printed.
pub fn committed(text: &str) -> Result<Committed, LineError> {
    read(text, Committed::default(), |c, fields| {
        match fields {
            ["was_held", h] => c.was_held = *h == "1",
            ["deleted", d] => c.deleted = d.parse().map_err(|_| "deleted")?,
            ["missing", m] => c.missing = m.parse().map_err(|_| "missing")?,
            ["gone", t, r] => c.gone.push((t.parse().map_err(|_| "gone")?, r.to_string())),
            _ => return Err("unknown line"),
        }
        Ok(())
    })
}

/// Reads what check.erl printed.
pub fn checked(text: &str) -> Result<Checked, LineError> {
    read(text, Checked::default(), |c, fields| {
        match fields {
            ["present", t, r] => c
                .present
                .push((t.parse().map_err(|_| "present")?, r.to_string())),
            ["deleted", t, r] => c
                .deleted
                .push((t.parse().map_err(|_| "deleted")?, r.to_string())),
            _ => return Err("unknown line"),
        }
        Ok(())
    })
}

/// Folds the prefixed lines of `text` into `out` by `line`, which names
/// the field it could not read; the `end` line must come, as only an
/// expression that ran to its end prints it.
fn read<T>(
    text: &str,
    mut out: T,
    mut line: impl FnMut(&mut T, &[&str]) -> Result<(), &'static str>,
) -> Result<T, LineError> {
    let mut ended = false;
    for (n, fields) in ours(text) {
        match fields.as_slice() {
            ["end"] => ended = true,
            fields => {
                line(&mut out, fields).map_err(|what| LineError::Malformed(n, what.to_string()))?
            }
        }
    }
    if !ended {
        return Err(LineError::Unfinished);
    }
    Ok(out)
}

/// The prefixed lines, numbered from 1, split into their fields.
fn ours(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let mut f = line.trim_end_matches('\r').split(' ');
        (f.next() == Some(PREFIX)).then(|| (i + 1, f.collect()))
    })
}

fn bytes(field: &str) -> Option<Vec<u8>> {
    B64.decode(field).ok()
}

fn text_of(field: &str) -> Option<String> {
    String::from_utf8(bytes(field)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> String {
        B64.encode(s)
    }

    #[test]
    fn a_chunk_reads_back_with_any_bytes_in_its_fields() {
        let body = b"line\nbreak\0\xff";
        let text = format!(
            "noise from rabbitmqctl\n\
             delayd-adopt node {}\n\
             delayd-adopt held 1\n\
             delayd-adopt entry 1700000000000 g1oAAw== {} {} {}\n\
             delayd-adopt orphan 1700000000001\n\
             delayd-adopt stats {} {} 3 132 1 2\n\
             delayd-adopt cursor g2gD\n\
             delayd-adopt end\n\
             ok\n",
            b(b"rabbit@a"),
            b(b"rk"),
            b(b"\x80\x00"),
            b(body),
            b(b"/"),
            b(b"other"),
        );
        let c = chunk(&text).unwrap();
        assert_eq!(c.node, "rabbit@a");
        assert!(c.held && c.tables);
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.entries[0].body, body);
        assert_eq!(c.entries[0].routing_key, b"rk");
        assert_eq!(c.entries[0].due_ms, 1_700_000_000_000);
        assert_eq!(c.orphans, vec![1_700_000_000_001]);
        assert_eq!(c.held_by[0].name, "other");
        assert_eq!(c.cursor.as_deref(), Some("g2gD"));
    }

    #[test]
    fn output_without_its_end_line_is_refused() {
        let text = format!("delayd-adopt node {}\ndelayd-adopt held 1\n", b(b"n"));
        let unfinished = [
            chunk(&text).err(),
            committed("delayd-adopt deleted 3\n").err(),
            checked("delayd-adopt present 5 QUJD\n").err(),
        ];
        for e in unfinished {
            assert!(matches!(e, Some(LineError::Unfinished)));
        }
    }

    #[test]
    fn a_check_reads_back() {
        let c = checked(
            "delayd-adopt present 5 QUJD\ndelayd-adopt deleted 7 RUZH\ndelayd-adopt end\nok\n",
        )
        .unwrap();
        assert_eq!(c.present, vec![(5, "QUJD".to_string())]);
        assert_eq!(c.deleted, vec![(7, "RUZH".to_string())]);
    }

    #[test]
    fn a_commit_reads_back() {
        let c = committed(
            "delayd-adopt was_held 0\ndelayd-adopt gone 17 g1oAAw==\ndelayd-adopt deleted 3\ndelayd-adopt missing 1\ndelayd-adopt end\nok\n",
        )
        .unwrap();
        assert_eq!(
            c,
            Committed {
                was_held: false,
                deleted: 3,
                missing: 1,
                gone: vec![(17, "g1oAAw==".into())],
            }
        );
    }
}
