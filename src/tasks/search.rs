//! Pending tasks whose member starts with a prefix (the body in body mode,
//! the id in id mode), found with `ZSCAN MATCH`, and in id mode tasks whose
//! body contains a text, found by `HSCAN` over `{K}:body`: bounded per call
//! (in members looked at, and a body search in time too), so a search
//! through millions of members is a series of cheap pages, each saying
//! whether the set was searched to its end.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::step_size::{self, StepSize};
use super::tenant_sets::{self, SetAt};
use super::{to_ms, Listed};
use crate::config::Business;
use crate::redis_conn::scripts::{BODY_SEARCH, SCAN_GLIMPSE};
use crate::store::{int_of, score_text, Glimpse, KeyFamily, StoreError};

/// `ZSCAN` calls one search page makes at most.
pub const CALLS_PER_PAGE: usize = 20;
/// The largest `COUNT` hint of a `ZSCAN`: members Redis looks at per call.
pub const SCAN_COUNT: usize = step_size::MOST;

/// Longest one search page keeps starting scan steps (each copies about
/// [`step_size::STEP_BYTES`] of matches in Redis).
pub const PAGE_TIME: Duration = Duration::from_millis(500);

/// One page of a search.
#[derive(Debug, Clone, Default)]
pub struct SearchPage {
    /// Matches found on this page, in the order Redis scanned them.
    pub tasks: Vec<Listed>,
    /// Pass to the next call to search on; `None` once every shard was
    /// searched to its end.
    pub cursor: Option<String>,
}

/// A `MATCH` pattern for members starting with `prefix`: glob characters
/// in the prefix are escaped, so they match themselves.
pub(super) fn pattern(prefix: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 1);
    for &b in prefix {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'*');
    out
}

/// `SET:SCANCURSOR`: the set as [`SetAt::encode`] names it (a body search
/// names a shard alone), the scan cursor in decimal.
fn decode_cursor(c: &str, shards: usize) -> Option<(SetAt, u64)> {
    let (s, z) = c.split_once(':')?;
    Some((SetAt::decode(s, shards)?, z.parse().ok()?))
}

/// Longest member prefix or body text a search takes, in bytes: a bound
/// on what every `ZSCAN` step compares, whoever asks.
pub const MAX_TEXT: usize = 1024;

/// Whether `c` is a cursor a search of `business` could have returned.
pub fn valid_cursor(business: &Business, c: &str) -> bool {
    decode_cursor(c, business.keys().len()).is_some()
}

/// Where a search page starts: the shard and scan cursor `cursor` names,
/// or the beginning.
fn start_at(cursor: Option<&str>, shards: usize) -> Result<(SetAt, u64), StoreError> {
    match cursor {
        Some(c) => decode_cursor(c, shards).ok_or_else(|| {
            StoreError::Reply(format!("search cursor \"{c}\" is not one delayd returned"))
        }),
        None => Ok((SetAt::default(), 0)),
    }
}

/// Up to about `limit` pending tasks whose member starts with `prefix`,
/// from where `cursor` left off, looking at no more than
/// [`CALLS_PER_PAGE`] × [`SCAN_COUNT`] members and starting no step after
/// [`PAGE_TIME`]. An empty page with a cursor is not the end: the matches
/// may lie further on.
///
/// A `ZSCAN` answers every match among the members it looks at, and one
/// cannot stop half-way without losing the rest, so each call looks at no
/// more members than matches are still wanted (a page returns at most
/// about twice `limit`, never thousands of bodies for a page of 50) nor
/// more than copy about [`step_size::STEP_BYTES`] at the sizes seen.
///
/// On a business with tenants the walk goes through each key's `K` and
/// the sets of the first [`tenant_sets::MOST_TENANTS`] tenants of its
/// index, by name, or through `tenant`'s sets alone.
pub async fn by_prefix<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    prefix: &[u8],
    limit: usize,
    cursor: Option<&str>,
    tenant: Option<&str>,
) -> Result<SearchPage, StoreError> {
    let (from, mut at) = start_at(cursor, business.keys().len())?;
    let sets = tenant_sets::pending_sets(conn, business, tenant, tenant_sets::MOST_TENANTS).await?;
    let names: Vec<SetAt> = sets.iter().map(|s| s.at.clone()).collect();
    let (mut set, same) = tenant_sets::resume_at(&names, &from);
    if !same {
        at = 0;
    }
    let pattern = pattern(prefix);
    let mut tasks = Vec::new();
    let mut calls = 0;
    let mut size = StepSize::default();
    let started = Instant::now();
    while set < sets.len()
        && calls < CALLS_PER_PAGE
        && tasks.len() < limit
        && started.elapsed() < PAGE_TIME
    {
        calls += 1;
        let count = (limit - tasks.len()).min(size.count());
        let reply: Vec<redis::Value> = SCAN_GLIMPSE
            .key(&sets[set].key)
            .arg(at)
            .arg(&pattern)
            .arg(count)
            .invoke_async(conn)
            .await?;
        let mut it = reply.into_iter();
        let next = int_of(it.next())? as u64;
        let bytes = int_of(it.next())?.max(0) as usize;
        let before = tasks.len();
        while let Some(member) = Glimpse::read(&mut it)? {
            let score = score_text(it.next())?;
            tasks.push(Listed {
                member,
                due_ms: to_ms(super::score_num(&score), business.score_unit),
                score,
            });
        }
        size.saw(tasks.len() - before, bytes);
        at = next;
        if at == 0 {
            set += 1;
        }
    }
    let cursor = sets.get(set).map(|s| format!("{}:{at}", s.at.encode()));
    Ok(SearchPage { tasks, cursor })
}

/// Most bytes of each matching body a body search brings out of Redis:
/// the 4 KiB an answer shows, and as much again for an intake message's
/// routing key and properties, which come before its body. A page thus
/// holds at most (`limit` + [`SCAN_COUNT`]) × (this + the id) bytes,
/// however large the bodies are.
pub const BODY_HEAD: usize = 8192;

/// One id whose body contains the text searched for.
#[derive(Debug, Clone)]
pub struct BodyMatch {
    /// The task id.
    pub id: Vec<u8>,
    /// The start of its stored body (an intake message's envelope in
    /// intake mode), at most [`BODY_HEAD`] bytes.
    pub head: Vec<u8>,
    /// The stored body's full size in bytes.
    pub size: usize,
    /// Its due time while it is pending; `None` in flight or dead.
    pub due_ms: Option<i64>,
}

/// One page of a body search.
#[derive(Debug, Clone, Default)]
pub struct BodyPage {
    /// Matches found on this page, in the order Redis scanned them.
    pub found: Vec<BodyMatch>,
    /// Pass to the next call to search on; `None` once every shard's body
    /// hash was searched to its end.
    pub cursor: Option<String>,
}

/// Up to about `limit` ids (id mode) whose body contains `text`, from where
/// `cursor` left off (the same `SHARD:CURSOR` form as [`by_prefix`]'s),
/// making at most [`CALLS_PER_PAGE`] `HSCAN` steps (each over about
/// [`step_size::STEP_BYTES`] of bodies, which Redis copies into Lua) and
/// starting none after [`PAGE_TIME`]. Only matches leave Redis, each body
/// cut to [`BODY_HEAD`] bytes there.
pub async fn by_body<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    text: &[u8],
    limit: usize,
    cursor: Option<&str>,
) -> Result<BodyPage, StoreError> {
    let keys = business.keys();
    let (from, mut at) = start_at(cursor, keys.len())?;
    let mut shard = from.shard;
    let started = Instant::now();
    let mut found = Vec::new();
    let mut size = StepSize::default();
    for _ in 0..CALLS_PER_PAGE {
        let fam = KeyFamily::new(&keys[shard]);
        let reply: Vec<redis::Value> = BODY_SEARCH
            .key(&fam.body)
            .arg(at)
            .arg(size.count())
            .arg(text)
            .arg(BODY_HEAD)
            .invoke_async(conn)
            .await?;
        let next = crate::store::int_of(reply.first().cloned())?;
        let looked = crate::store::int_of(reply.get(1).cloned())?.max(0) as usize;
        let bytes = crate::store::int_of(reply.get(2).cloned())?.max(0) as usize;
        size.saw(looked, bytes);
        let mut matches = Vec::new();
        for m in reply.get(3..).unwrap_or_default().chunks(3) {
            if let [id, size, head] = m {
                matches.push(BodyMatch {
                    id: crate::store::bytes_of(id)?,
                    head: crate::store::bytes_of(head)?,
                    size: crate::store::int_of(Some(size.clone()))?.max(0) as usize,
                    due_ms: None,
                });
            }
        }
        let due = due_of(conn, business, &keys[shard], &matches).await?;
        for (mut m, s) in matches.into_iter().zip(due) {
            m.due_ms = s.map(|s| to_ms(s, business.score_unit));
            found.push(m);
        }
        at = next.max(0) as u64;
        if at == 0 {
            shard += 1;
            if shard == keys.len() {
                return Ok(BodyPage {
                    found,
                    cursor: None,
                });
            }
        }
        if found.len() >= limit || started.elapsed() >= PAGE_TIME {
            break;
        }
    }
    Ok(BodyPage {
        found,
        cursor: Some(format!("{shard}:{at}")),
    })
}

/// The pending scores of the matched ids on `key`: in `K` (one pipeline),
/// else, on a business with tenants, in the tenant's set that holds it.
async fn due_of<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    key: &str,
    matches: &[BodyMatch],
) -> Result<Vec<Option<f64>>, StoreError> {
    let ids: Vec<&[u8]> = matches.iter().map(|m| &m.id[..]).collect();
    let mut scores = scores_in(conn, key, &ids).await?;
    let missed: Vec<usize> = (0..ids.len()).filter(|&i| scores[i].is_none()).collect();
    if business.tenants.is_none() || missed.is_empty() {
        return Ok(scores);
    }
    let asked: Vec<&[u8]> = missed.iter().map(|&i| ids[i]).collect();
    let in_tenants = tenant_sets::find_each(conn, key, &asked).await?;
    // A claim may have moved one into `K` between the two looks.
    let again = scores_in(conn, key, &asked).await?;
    for ((&i, t), k) in missed.iter().zip(in_tenants).zip(again) {
        scores[i] = t.map(|t| t.score).or(k);
    }
    Ok(scores)
}

/// The scores of `ids` in `key`, in one pipeline.
async fn scores_in<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    ids: &[&[u8]],
) -> Result<Vec<Option<f64>>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.zscore(key, id);
    }
    Ok(pipe.query_async(conn).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_in_a_prefix_match_themselves() {
        assert_eq!(pattern(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*".to_vec());
        assert_eq!(pattern(b""), b"*".to_vec());
    }

    #[test]
    fn cursors_name_a_shard_that_exists_and_maybe_a_tenant() {
        let at = |shard, tenant: Option<&str>| SetAt {
            shard,
            tenant: tenant.map(str::to_string),
        };
        assert_eq!(decode_cursor("1:42", 2), Some((at(1, None), 42)));
        assert_eq!(decode_cursor("1/61:7", 2), Some((at(1, Some("a")), 7)));
        assert_eq!(decode_cursor("1/6:7", 2), None);
        assert_eq!(decode_cursor("2:42", 2), None);
        assert_eq!(decode_cursor("x", 2), None);
        assert_eq!(decode_cursor("0:-1", 2), None);
    }
}
