//! The Erlang expressions `delayd adopt` runs on a broker node
//! (`src/adopt/*.erl`, each with a header naming its placeholders and what
//! it prints), filled in here. Every value from outside reaches Erlang as
//! base64 or as a number, so no name or byte can break out of its literal.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

const READ: &str = include_str!("read.erl");
const LOAD: &str = include_str!("load.erl");
const MODULE: &str = include_str!("delayd_adopt.erl");
const COMMIT: &str = include_str!("commit.erl");
const CHECK: &str = include_str!("check.erl");
const EXPORT: &str = include_str!("export.erl");

/// The plugin exchange whose messages move: its vhost and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The virtual host.
    pub vhost: String,
    /// The exchange's name.
    pub name: String,
}

/// How much one chunk reads before the plugin is resumed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries of the exchange.
    pub entries: usize,
    /// Message bytes (properties and body) of the exchange.
    pub bytes: usize,
    /// Index keys visited, of any exchange (bounds the hold where the
    /// backlog is mostly other exchanges').
    pub scan: usize,
}

/// One chunk: suspends the plugin (when `hold`), prints the exchange's
/// entries after `cursor`, up to `limits`, and the counts per exchange.
pub fn read(x: &Exchange, hold: bool, limits: Limits, cursor: Option<&str>) -> String {
    read_from(x, hold, limits, cursor, "0")
}

/// [`read`], printing only entries due from `not_before` (an Erlang
/// expression giving epoch ms).
fn read_from(
    x: &Exchange,
    hold: bool,
    limits: Limits,
    cursor: Option<&str>,
    not_before: &str,
) -> String {
    fill(
        READ,
        x,
        &[
            ("@HOLD@", hold.to_string()),
            ("@ENTRIES@", limits.entries.to_string()),
            ("@BYTES@", limits.bytes.to_string()),
            ("@SCAN@", limits.scan.to_string()),
            ("@CURSOR@", only_base64(cursor.unwrap_or("")).to_string()),
            ("@NOT_BEFORE@", not_before.to_string()),
        ],
    )
}

/// Counts per exchange on a node, without holding the plugin or printing
/// a message (`--dry-run`).
pub fn survey(x: &Exchange) -> String {
    read(
        x,
        false,
        Limits {
            entries: 0,
            bytes: 0,
            scan: 0,
        },
        None,
    )
}

/// Deletes the entries `items` names (`(timestamp, [ref])`, each ref as
/// `read` printed it), then resumes the plugin when `resume`. Their refs
/// are recorded first, anew when `fresh`, else added to what the record
/// holds (see [`check_calls`]).
pub fn commit(x: &Exchange, items: &[(i64, Vec<String>)], resume: bool, fresh: bool) -> String {
    let mut list = String::from("[");
    for (i, (ts, refs)) in items.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push_str(&format!("{{{ts},["));
        for (j, r) in refs.iter().enumerate() {
            if j > 0 {
                list.push(',');
            }
            // Refs are base64 (read.erl printed them): nothing to escape.
            list.push_str(&format!("<<\"{}\">>", only_base64(r)));
        }
        list.push_str("]}");
    }
    list.push(']');
    fill(
        COMMIT,
        x,
        &[
            ("@ITEMS@", list),
            ("@RESUME@", resume.to_string()),
            ("@FRESH@", fresh.to_string()),
        ],
    )
}

/// [`commit`] for `rabbitmqctl eval`, whose refs travel as values after
/// the expression (bound to `_1`, `_2`, ...: lines `TIMESTAMP REF REF ...`),
/// each value at most `max_value` bytes and each call's values at most
/// `max_call` bytes together; only the last call resumes the plugin (when
/// `resume`), and only the first starts the record of what is deleted
/// anew. A chunk's refs can be far longer than one argument may be.
/// A timestamp's refs may be split between two lines or calls (each
/// deletes the index key once none of its entries is left). Always at
/// least one call.
pub fn commit_calls(
    x: &Exchange,
    items: &[(i64, Vec<String>)],
    resume: bool,
    max_value: usize,
    max_call: usize,
) -> Vec<(String, Vec<String>)> {
    let calls = value_calls(items, max_value, max_call);
    let last = calls.len() - 1;
    calls
        .into_iter()
        .enumerate()
        .map(|(i, values)| {
            let expr = fill(
                COMMIT,
                x,
                &[
                    ("@ITEMS@", items_of(values.len())),
                    ("@RESUME@", (resume && i == last).to_string()),
                    ("@FRESH@", (i == 0).to_string()),
                ],
            );
            (expr, values)
        })
        .collect()
}

/// Where each entry `items` names is now (check.erl): still in the plugin,
/// deleted by the last chunk's commit, or neither (the plugin delivered
/// it); split into calls as [`commit_calls`].
pub fn check_calls(
    x: &Exchange,
    items: &[(i64, Vec<String>)],
    max_value: usize,
    max_call: usize,
) -> Vec<(String, Vec<String>)> {
    value_calls(items, max_value, max_call)
        .into_iter()
        .map(|values| {
            let expr = fill(CHECK, x, &[("@ITEMS@", items_of(values.len()))]);
            (expr, values)
        })
        .collect()
}

/// `items` as values of lines `TIMESTAMP REF REF ...` (see
/// [`commit_calls`]), grouped into calls; always at least one call.
fn value_calls(
    items: &[(i64, Vec<String>)],
    max_value: usize,
    max_call: usize,
) -> Vec<Vec<String>> {
    // Lines of at most max_value bytes.
    let mut lines: Vec<String> = Vec::new();
    for (ts, refs) in items {
        let mut line = ts.to_string();
        let mut has_ref = false;
        for r in refs {
            let r = only_base64(r);
            if line.len() + 1 + r.len() + 1 > max_value && has_ref {
                lines.push(std::mem::replace(&mut line, ts.to_string()));
            }
            line.push(' ');
            line.push_str(r);
            has_ref = true;
        }
        lines.push(line);
    }
    // Values of whole lines, calls of whole values.
    let mut calls: Vec<Vec<String>> = vec![Vec::new()];
    let mut value = String::new();
    let mut used = 0;
    let flush = |value: &mut String, calls: &mut Vec<Vec<String>>, used: &mut usize| {
        if value.is_empty() {
            return;
        }
        if *used + value.len() > max_call && *used > 0 {
            calls.push(Vec::new());
            *used = 0;
        }
        *used += value.len();
        calls
            .last_mut()
            .expect("never empty")
            .push(std::mem::take(value));
    };
    for line in lines {
        if value.len() + line.len() + 1 > max_value {
            flush(&mut value, &mut calls, &mut used);
        }
        value.push_str(&line);
        value.push('\n');
    }
    flush(&mut value, &mut calls, &mut used);
    calls
}

/// The `@ITEMS@` of an expression given `n` values.
fn items_of(n: usize) -> String {
    let names: Vec<String> = (1..=n).map(|n| format!("_{n}")).collect();
    format!("{}:items([{}])", module_name(), names.join(","))
}

/// The two-step form's first step, for an operator to run on the broker
/// host: writes the exchange's entries on that node to `path` there, in
/// the lines [`read`] prints, without holding the plugin. Entries due
/// within `margin_ms` of the export stay with the plugin: the delete step
/// must run before the first exported entry falls due.
pub fn export(x: &Exchange, path: &str, margin_ms: u64) -> String {
    let all = Limits {
        entries: usize::MAX >> 2,
        bytes: usize::MAX >> 2,
        scan: 0,
    };
    let not_before = format!("erlang:system_time(millisecond) + {margin_ms}");
    let read = read_from(x, false, all, None, &not_before);
    let read = read.trim_end().trim_end_matches('.');
    fill(
        EXPORT,
        x,
        &[("@PATH@", B64.encode(path)), ("@READ@", read.to_string())],
    )
}

/// The template without its header comment, placeholders filled; its
/// `@LOAD@` compiles and loads `delayd_adopt.erl` on the node, under a name
/// of its own per source text.
fn fill(template: &str, x: &Exchange, extra: &[(&str, String)]) -> String {
    let module = module_name();
    let source = MODULE.replace("-module(delayd_adopt).", &format!("-module({module})."));
    let mut s = code(template)
        .replace("@LOAD@", &code(LOAD))
        .replace("@SOURCE@", &B64.encode(source))
        .replace("@MODULE@", &module)
        .replace("@VHOST@", &B64.encode(&x.vhost))
        .replace("@NAME@", &B64.encode(&x.name));
    for (k, v) in extra {
        s = s.replace(k, v);
    }
    s
}

/// The name `delayd_adopt.erl` is loaded under: one per source text.
fn module_name() -> String {
    format!(
        "delayd_adopt_{:016x}",
        xxhash_rust::xxh3::xxh3_64(MODULE.as_bytes())
    )
}

/// Erlang text without its `%%` comment lines.
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("%%"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `s` if it is base64 text, else empty (a ref that did not come from
/// read.erl cannot name an entry).
fn only_base64(s: &str) -> &str {
    if s.bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
    {
        s
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x() -> Exchange {
        Exchange {
            vhost: "/".into(),
            name: "orders\">>, halt().".into(),
        }
    }

    #[test]
    fn names_reach_erlang_as_base64_only() {
        let e = read(
            &x(),
            true,
            Limits {
                entries: 10,
                bytes: 100,
                scan: 0,
            },
            None,
        );
        assert!(!e.contains("halt()"));
        assert!(e.contains(&B64.encode("orders\">>, halt().")));
        assert!(!e.contains('@'), "every placeholder filled");
        assert!(e.contains("10, 100, 0, <<\"\">>, 0)"), "{e}");
    }

    #[test]
    fn commit_calls_fit_the_limits_keep_every_ref_once_and_only_the_last_resumes() {
        let refs = |ts: i64, n: usize| -> (i64, Vec<String>) {
            (
                ts,
                (0..n)
                    .map(|i| format!("{:0>64}", ts * 10_000 + i as i64))
                    .collect(),
            )
        };
        let items = vec![refs(1, 1500), (2, vec![]), refs(3, 2500)];
        let (max_value, max_call) = (20_000, 60_000);
        let calls = commit_calls(&x(), &items, true, max_value, max_call);
        assert!(calls.len() > 2, "{} calls", calls.len());
        let mut seen = Vec::new();
        let mut orphan = false;
        for (i, (expr, values)) in calls.iter().enumerate() {
            assert!(values.iter().all(|v| v.len() <= max_value), "call {i}");
            assert!(values.iter().map(String::len).sum::<usize>() <= max_call);
            let names: Vec<String> = (1..=values.len()).map(|n| format!("_{n}")).collect();
            assert!(
                expr.contains(&format!(":items([{}])", names.join(","))),
                "{expr}"
            );
            let last = i == calls.len() - 1;
            let tail = format!("{}, {})\nend.", last, i == 0);
            assert!(
                expr.trim_end().ends_with(&tail),
                "call {i}: resumes only last, fresh only first"
            );
            for line in values.iter().flat_map(|v| v.lines()) {
                let mut words = line.split(' ');
                let ts: i64 = words.next().unwrap().parse().unwrap();
                let these: Vec<&str> = words.collect();
                orphan |= ts == 2 && these.is_empty();
                for r in these {
                    assert_eq!(
                        r.parse::<i64>().unwrap() / 10_000,
                        ts,
                        "under its timestamp"
                    );
                    seen.push(r.to_string());
                }
            }
        }
        assert!(orphan, "the orphan key too");
        seen.sort();
        let mut want: Vec<String> = items.iter().flat_map(|(_, r)| r.clone()).collect();
        want.sort();
        assert_eq!(seen, want);
        assert_eq!(commit_calls(&x(), &[], false, max_value, max_call).len(), 1);
    }

    #[test]
    fn commit_lists_each_timestamp_with_its_refs_and_drops_what_is_not_base64() {
        let items = vec![
            (5, vec!["QUJD".to_string(), "\">>, halt()".to_string()]),
            (7, vec![]),
        ];
        let e = commit(&x(), &items, true, true);
        assert!(
            e.contains(r#", [{5,[<<"QUJD">>,<<"">>]},{7,[]}], true, true)"#),
            "{e}"
        );
        assert!(!e.contains('@'));
    }
}
