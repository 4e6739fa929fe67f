//! The far-future-writes phase of `delayd bench`: producers writing members
//! due in a week, at a steady rate, while delayd runs on the same key. What
//! it costs delayd and Redis, per producer write, from `INFO commandstats`
//! before and after (commands of every client of that Redis, other than the
//! producers' `ZADD`s and the bench's own `INFO`, count as delayd's).

use std::collections::HashMap;
use std::time::Duration;

use super::{fail, BenchError};
use crate::redis_conn::RedisConn;
use crate::store::KeyFamily;

/// How long a member written by the phase is ahead of its due time.
const WEEK_MS: i64 = 7 * 86_400_000;

/// What the phase measured.
pub(super) struct FarWrites {
    /// Producer `ZADD`s sent.
    pub writes: u64,
    /// Other commands Redis ran meanwhile (delayd's), per write.
    pub calls_per_write: f64,
    /// Of which script calls (claims and looks run as scripts).
    pub scripts_per_write: f64,
    /// Redis time of those commands against the producers' `ZADD`s.
    pub time_ratio: f64,
}

/// Writes `rate` members per second due in a week for `secs` seconds,
/// spread over `fams` as producers would, and compares Redis's command
/// statistics before and after.
pub(super) async fn run(
    redis: &mut RedisConn,
    fams: &[KeyFamily],
    rate: u32,
    secs: u64,
) -> Result<FarWrites, BenchError> {
    let before = commandstats(redis).await?;
    let mut pace = super::pace::Pace::new(rate, secs, Duration::from_millis(5));
    let mut sent = 0usize;
    while let Some(want) = pace.upto(sent).await {
        if want <= sent {
            continue;
        }
        let now = super::wall_ms_f() as i64;
        let mut pipe = redis::pipe();
        for i in sent..want {
            let f = &fams[i % fams.len()];
            pipe.cmd("ZADD")
                .arg(&f.pending)
                .arg(now + WEEK_MS)
                .arg(format!("far-{i}-{now}"))
                .ignore();
        }
        let () = pipe
            .query_async(redis)
            .await
            .map_err(|e| fail("redis")(e.to_string()))?;
        sent = want;
    }
    // Let the last wake-ups run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = commandstats(redis).await?;
    let delta = |name: &str| {
        let (c1, u1) = after.get(name).copied().unwrap_or((0, 0));
        let (c0, u0) = before.get(name).copied().unwrap_or((0, 0));
        (c1.saturating_sub(c0), u1.saturating_sub(u0))
    };
    let (writes, zadd_usec) = delta("zadd");
    let (mut calls, mut usec, mut scripts) = (0u64, 0u64, 0u64);
    for name in after.keys() {
        if matches!(name.as_str(), "zadd" | "info" | "config") {
            continue;
        }
        let (c, u) = delta(name);
        calls += c;
        usec += u;
        if name.starts_with("eval") || name.starts_with("fcall") {
            scripts += c;
        }
    }
    let per = |n: u64| n as f64 / writes.max(1) as f64;
    Ok(FarWrites {
        writes,
        calls_per_write: per(calls),
        scripts_per_write: per(scripts),
        time_ratio: usec as f64 / zadd_usec.max(1) as f64,
    })
}

/// `INFO commandstats` as command -> (calls, usec), summed over every
/// master: a cluster answers with one text per node.
pub(super) async fn commandstats(
    redis: &mut RedisConn,
) -> Result<HashMap<String, (u64, u64)>, BenchError> {
    let reply: redis::Value = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await
        .map_err(|e| fail("redis")(e.to_string()))?;
    let mut texts = Vec::new();
    texts_of(&reply, &mut texts);
    let mut total: HashMap<String, (u64, u64)> = HashMap::new();
    for text in texts {
        for (name, (calls, usec)) in parse_commandstats(&text) {
            let t = total.entry(name).or_default();
            t.0 += calls;
            t.1 += usec;
        }
    }
    Ok(total)
}

/// The texts in an `INFO` reply: one from a server, one per node (keyed by
/// its address) from a cluster.
fn texts_of(v: &redis::Value, out: &mut Vec<String>) {
    match v {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::VerbatimString { text, .. } => out.push(text.clone()),
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, v)| texts_of(v, out)),
        redis::Value::Array(items) => items.iter().for_each(|v| texts_of(v, out)),
        _ => {}
    }
}

/// Script calls and their Redis time (µs) between two `INFO commandstats`.
pub(super) fn script_calls(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
) -> (u64, u64) {
    let mut out = (0, 0);
    for (name, (c1, u1)) in after {
        if name.starts_with("eval") || name.starts_with("fcall") {
            let (c0, u0) = before.get(name).copied().unwrap_or((0, 0));
            out.0 += c1.saturating_sub(c0);
            out.1 += u1.saturating_sub(u0);
        }
    }
    out
}

/// Reads `cmdstat_NAME:calls=N,usec=N,...` lines.
fn parse_commandstats(text: &str) -> HashMap<String, (u64, u64)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls="), field("usec=")));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn commandstats_lines_give_calls_and_usec() {
        let text = "# Commandstats\r\ncmdstat_zadd:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_evalsha:calls=2,usec=400,usec_per_call=200.00\r\n";
        let s = super::parse_commandstats(text);
        assert_eq!(s["zadd"], (10, 50));
        assert_eq!(s["evalsha"], (2, 400));
        assert_eq!(s.len(), 2);
    }
}
