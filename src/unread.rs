//! Members waiting under key names a business does not read: the other shard
//! naming, shard indexes at or above `shards`, or the unsharded key of a
//! sharded business. Producers that follow another naming (or a deployment
//! that moved between Redis modes or shard counts) would otherwise write
//! work that is never delivered, without a word.

use crate::config::Business;
use crate::keys::{shard_keys, ShardNames};
use crate::redis_conn::RedisConn;

/// Keys a business with this configuration does not read but a producer
/// could plausibly write: the other naming's shard keys, index names up to
/// `2 × shards + 8`, and `K` itself (or `K:0..`) across a change of
/// `shards`. At most about `3 × shards + 9` names, looked up once at start.
pub fn candidates(b: &Business) -> Vec<(String, Reader)> {
    let read: std::collections::HashSet<String> = b.keys().into_iter().collect();
    let mut out: Vec<(String, Reader)> = Vec::new();
    let mut add = |k: String, r: Reader| {
        if !read.contains(&k) && !out.iter().any(|(o, _)| *o == k) {
            out.push((k, r));
        }
    };
    if b.shards > 1 {
        let other = match b.shard_names {
            ShardNames::Index => ShardNames::Spread,
            ShardNames::Spread => ShardNames::Index,
        };
        for k in shard_keys(&b.key, b.shards, other) {
            add(k, Reader::Names(other));
        }
        add(b.key.clone(), Reader::Shards(1));
    }
    for i in 0..(2 * b.shards + 8) {
        add(format!("{}:{i}", b.key), Reader::Shards(i + 1));
    }
    out
}

/// The setting that would make delayd read a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// `shard_names` with this value.
    Names(ShardNames),
    /// `shards` at least this many (1: the unsharded key).
    Shards(usize),
}

impl Reader {
    fn setting(self) -> String {
        match self {
            Reader::Names(ShardNames::Spread) => "shard_names = \"spread\"".into(),
            Reader::Names(ShardNames::Index) => "shard_names = \"index\"".into(),
            Reader::Shards(1) => "shards = 1".into(),
            Reader::Shards(n) => format!("shards = {n} (or more)"),
        }
    }
}

/// A key with members that the business does not read.
#[derive(Debug, Clone)]
pub struct Unread {
    pub key: String,
    pub members: u64,
    pub reader: Reader,
}

/// Looks up every candidate's `ZCARD`; keys of another type are not counted.
pub async fn find(conn: &RedisConn, b: &Business) -> Result<Vec<Unread>, redis::RedisError> {
    let mut found = Vec::new();
    for (key, reader) in candidates(b) {
        let mut c = conn.clone();
        let members: u64 = match redis::cmd("ZCARD").arg(&key).query_async(&mut c).await {
            Ok(n) => n,
            Err(e) if e.to_string().contains("WRONGTYPE") => 0,
            Err(e) => return Err(e),
        };
        if members > 0 {
            found.push(Unread {
                key,
                members,
                reader,
            });
        }
    }
    Ok(found)
}

/// One line for `found` (non-empty): the keys, their members and the setting
/// that reads each, and how to start anyway.
pub fn describe(b: &Business, found: &[Unread]) -> String {
    let total: u64 = found.iter().map(|u| u.members).sum();
    let shown: Vec<String> = found
        .iter()
        .take(5)
        .map(|u| {
            format!(
                "\"{}\" ({} members; {} reads it)",
                u.key,
                u.members,
                u.reader.setting()
            )
        })
        .collect();
    let more = if found.len() > shown.len() {
        format!(" and {} more key(s)", found.len() - shown.len())
    } else {
        String::new()
    };
    format!(
        "business \"{}\": {total} member(s) wait under key(s) it does not read: {}{more}; producers must write the keys `delayd shards {}` prints, or change the setting named; set ignore_unread_keys = true to start anyway",
        b.name,
        shown.join(", "),
        b.name
    )
}
