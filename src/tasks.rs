//! Scheduled work addressed by its member: schedule, look up, cancel,
//! reschedule and list one task at O(log N), for the commands.
//!
//! The member is the task id in id mode (`member = "id"`, body in `{K}:body`)
//! and the body itself in body mode; [`MemberMode`] is consulted here, once,
//! for where the body lives. Every call is generic over the connection, so
//! it works over whatever Redis connection the caller holds.

use crate::redis_conn::scripts;

use redis::aio::ConnectionLike;

use crate::config::intake_settings::DEFAULT_TENANT;
use crate::config::{Business, MemberMode, ScoreUnit};
use crate::store::{Glimpse, KeyFamily, StoreError};

pub mod audit;
pub mod bulk;
pub mod dead;
mod merge;
pub mod pause;
pub mod search;
pub mod step_size;
pub mod tenant_sets;
pub mod tenants;
pub mod when;

pub use crate::keys::shard_of;

use merge::Merge;

// Registered like every other script, so that a `NOSCRIPT` from a restarted
// or promoted node is answered with `EVAL` on that same node.

/// Where a task is, as `delayd get` reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting in `K` for its due time.
    Pending {
        /// Due time, epoch ms.
        due_ms: i64,
    },
    /// Claimed; a publish is under way or awaiting the broker's confirm.
    InFlight {
        /// When its lease ends, epoch ms.
        lease_deadline_ms: i64,
        /// Due time of a pending copy re-added meanwhile, epoch ms.
        #[serde(skip_serializing_if = "Option::is_none")]
        pending_due_ms: Option<i64>,
    },
    /// Given up after its attempts, or refused for good.
    Dead {
        /// When it died, epoch ms.
        died_ms: i64,
        /// Why, as `dead list` shows it.
        reason: String,
        /// Publish attempts made, when the reason records them.
        #[serde(skip_serializing_if = "Option::is_none")]
        attempts: Option<u32>,
    },
    /// Not pending, in flight or dead: delivered, cancelled or never scheduled.
    NotFound,
}

/// One task looked up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Lookup {
    /// The key (shard) it was found on, or the one it would be on.
    pub key: String,
    /// Where it is.
    #[serde(flatten)]
    pub state: TaskState,
    /// Its body in id mode, while one is stored: the whole body, or only
    /// its start when the look-up was given a cut.
    #[serde(skip)]
    pub body: Option<Vec<u8>>,
    /// The stored body's full size in bytes (0 without one).
    #[serde(skip)]
    pub body_size: usize,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cancelled {
    /// Removed while pending: it will not be delivered.
    Cancelled,
    /// Claimed already: the delivery under way goes ahead.
    InFlight,
    /// In the dead set; `delayd dead purge` removes dead tasks.
    Dead,
    /// Nothing pending under this member.
    NotFound,
}

/// One pending task on a page of `delayd list`.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The member: the id in id mode, the body in body mode (its start
    /// when longer than a glimpse).
    pub member: Glimpse,
    /// The score as Redis printed it (exact, for the cursor).
    pub score: String,
    /// Due time, epoch ms.
    pub due_ms: i64,
}

/// One page of `delayd list`.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Tasks in due order.
    pub tasks: Vec<Listed>,
    /// Pass to the next call to continue after this page; `None` at the end.
    pub cursor: Option<String>,
}

/// The keys to look in for `member`: its hash shard first, then the others,
/// since producers may spread ids with a hash of their own.
fn search_order(keys: &[String], member: &[u8]) -> Vec<String> {
    let first = shard_of(keys, member).to_string();
    let mut out = vec![first.clone()];
    out.extend(keys.iter().filter(|k| **k != first).cloned());
    out
}

fn to_ms(score: f64, unit: ScoreUnit) -> i64 {
    let ms = score * unit.millis() as f64;
    ms.clamp(i64::MIN as f64, i64::MAX as f64) as i64
}

/// A due time in epoch ms as the score a business's producers write.
pub fn score_of(due_ms: i64, unit: ScoreUnit) -> f64 {
    due_ms as f64 / unit.millis() as f64
}

/// Redis's clock, epoch ms: the clock due times are compared against.
pub async fn redis_now_ms<C: ConnectionLike>(conn: &mut C) -> Result<i64, StoreError> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Schedules `member` due at `due_ms`; in id mode `body` is stored beside it
/// in the same `MULTI`, so no claim ever sees the id without its body. On a
/// business with tenants it goes into `tenant`'s set (the default tenant
/// without one) and the tenant into the index, as producers write it
/// (docs/tenants.md); the caller refuses a tenant for a business without.
/// Returns the key written.
pub async fn schedule<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    member: &[u8],
    body: Option<&[u8]>,
    tenant: Option<&[u8]>,
    due_ms: i64,
) -> Result<String, StoreError> {
    let keys = business.keys();
    let key = shard_of(&keys, member).to_string();
    let fam = KeyFamily::new(&key);
    let score = score_of(due_ms, business.score_unit);
    let mut pipe = redis::pipe();
    pipe.atomic();
    if let (MemberMode::Id { .. }, Some(body)) = (business.member, body) {
        pipe.hset(&fam.body, member, body).ignore();
    }
    if business.tenants.is_some() {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT.as_bytes());
        let set = fam.tenant_set(tenant);
        pipe.zadd(&set, member, score).ignore();
        pipe.cmd("ZADD")
            .arg(fam.tenant_index())
            .arg("LT")
            .arg(score)
            .arg(tenant)
            .ignore();
        pipe.query_async::<()>(conn).await?;
        return Ok(String::from_utf8_lossy(&set).into_owned());
    }
    pipe.zadd(&key, member, score).ignore();
    pipe.query_async::<()>(conn).await?;
    Ok(key)
}

/// Why `tenant` cannot be given for `business`, in one line: a business
/// without tenants, or a name that cannot be a tenant's.
pub fn tenant_refused(business: &Business, tenant: &[u8]) -> Option<String> {
    if let Some(why) = tenants::none_in(business) {
        return Some(format!("{why}: leave the tenant out"));
    }
    (!crate::config::intake_settings::names_a_tenant(tenant))
        .then(|| "a tenant is 1 to 200 bytes of text without control characters".to_string())
}

/// How a front end tells its caller to fix a task given with an id where
/// none applies, or without one where it is needed: each names its own
/// flag or field.
pub struct IdFixes {
    /// What an id-mode business asks for when no id was given.
    pub give_id: &'static str,
    /// What a body-mode business says of the id it was given.
    pub drop_id: &'static str,
}

/// Why a task to schedule on `business` cannot be given as asked, with an
/// id (`has_id`) or without: an id-mode business needs its id, a body-mode
/// one addresses its tasks by their body. Both front ends refuse alike.
pub fn id_refused(business: &Business, has_id: bool, fixes: &IdFixes) -> Option<String> {
    let name = &business.name;
    match (business.member, has_id) {
        (MemberMode::Id { .. }, false) => Some(format!(
            "business \"{name}\" has member = \"id\": {}",
            fixes.give_id
        )),
        (MemberMode::Body, true) => Some(format!(
            "business \"{name}\" has member = \"body\": its tasks are addressed by their body, so {}",
            fixes.drop_id
        )),
        _ => None,
    }
}

/// Where `member` is, looking in every shard (its hash shard first). With
/// `cut`, at most that many bytes of an id-mode body leave Redis (its start,
/// with its full size), so a look-up costs the caller a bounded amount
/// however large the body is; without, the whole body.
pub async fn get<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    member: &[u8],
    cut: Option<usize>,
) -> Result<Lookup, StoreError> {
    let keys = business.keys();
    let order = search_order(&keys, member);
    for key in &order {
        let mut found = match tenant_sets::find_for(conn, business, key, member).await? {
            Some(t) => Lookup {
                key: String::from_utf8_lossy(&t.set).into_owned(),
                state: TaskState::Pending {
                    due_ms: to_ms(t.score, business.score_unit),
                },
                body: None,
                body_size: 0,
            },
            None => get_in(conn, business, key, member).await?,
        };
        if business.member.is_id() && found.state != TaskState::NotFound {
            (found.body, found.body_size) = body_of(conn, key, member, cut).await?;
        }
        if found.state != TaskState::NotFound {
            return Ok(found);
        }
    }
    Ok(Lookup {
        key: order[0].clone(),
        state: TaskState::NotFound,
        body: None,
        body_size: 0,
    })
}

/// The body stored for `id` on `key` (its first `cut` bytes with a cut) and
/// its full size.
async fn body_of<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    id: &[u8],
    cut: Option<usize>,
) -> Result<(Option<Vec<u8>>, usize), StoreError> {
    let fam = KeyFamily::new(key);
    let Some(cut) = cut else {
        let body: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&fam.body)
            .arg(id)
            .query_async(conn)
            .await?;
        let size = body.as_ref().map_or(0, Vec::len);
        return Ok((body, size));
    };
    let reply: Vec<redis::Value> = scripts::BODY_HEAD
        .key(&fam.body)
        .arg(id)
        .arg(cut)
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [size, head] => Ok((
            Some(crate::store::bytes_of(head)?),
            crate::store::int_of(Some(size.clone()))?.max(0) as usize,
        )),
        _ => Ok((None, 0)),
    }
}

type Snapshot = (Option<f64>, Option<f64>, Option<f64>, Option<String>);

async fn get_in<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    key: &str,
    member: &[u8],
) -> Result<Lookup, StoreError> {
    let fam = KeyFamily::new(key);
    // One transaction: a claim cannot run between the reads.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .zscore(&fam.pending, member)
        .zscore(&fam.inflight, member)
        .zscore(&fam.dead, member)
        .hget(&fam.reasons, member);
    let (pending, in_flight, dead, reason): Snapshot = pipe.query_async(conn).await?;
    let unit = business.score_unit;
    let state = match (in_flight, pending, dead) {
        (Some(lease), p, _) => TaskState::InFlight {
            lease_deadline_ms: lease as i64,
            pending_due_ms: p.map(|s| to_ms(s, unit)),
        },
        (None, Some(p), _) => TaskState::Pending {
            due_ms: to_ms(p, unit),
        },
        (None, None, Some(died)) => {
            let reason = reason.unwrap_or_default();
            TaskState::Dead {
                died_ms: died as i64,
                attempts: attempts_in(&reason),
                reason,
            }
        }
        (None, None, None) => TaskState::NotFound,
    };
    Ok(Lookup {
        key: key.to_string(),
        state,
        body: None,
        body_size: 0,
    })
}

/// The attempt count a dead reason ends with ("... after 5 attempts").
fn attempts_in(reason: &str) -> Option<u32> {
    let rest = reason.rsplit_once(" after ")?.1;
    rest.strip_suffix(" attempts")
        .or_else(|| rest.strip_suffix(" attempt"))?
        .parse()
        .ok()
}

/// Cancels `member` if it is pending, atomically with respect to claims.
/// In id mode its body goes too, unless a delivery or the dead set still
/// needs it.
pub async fn cancel<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    member: &[u8],
) -> Result<(String, Cancelled), StoreError> {
    let keys = business.keys();
    let order = search_order(&keys, member);
    let mut seen = (order[0].clone(), Cancelled::NotFound);
    for key in &order {
        let fam = KeyFamily::new(key);
        // A task still in its tenant's set is cancelled there, exactly as
        // in K (a claim that took it meanwhile leaves K's turn below).
        if let Some(t) = tenant_sets::find_for(conn, business, key, member).await? {
            if cancel_in(conn, business, &fam, &t.set, member).await? == "cancelled" {
                let set = String::from_utf8_lossy(&t.set).into_owned();
                return Ok((set, Cancelled::Cancelled));
            }
        }
        let state = cancel_in(conn, business, &fam, fam.pending.as_bytes(), member).await?;
        let outcome = match state.as_str() {
            "cancelled" => Cancelled::Cancelled,
            "in_flight" => Cancelled::InFlight,
            "dead" => Cancelled::Dead,
            "not_found" => Cancelled::NotFound,
            other => return Err(StoreError::Reply(format!("cancel: {other}"))),
        };
        if outcome != Cancelled::NotFound {
            seen = (key.clone(), outcome);
            if outcome != Cancelled::Dead {
                return Ok(seen);
            }
        }
    }
    Ok(seen)
}

/// `cancel.lua` on `pending` (K, or a tenant's set) and `fam`'s other
/// keys: "cancelled", "in_flight", "dead" or "not_found".
async fn cancel_in<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    fam: &KeyFamily,
    pending: &[u8],
    member: &[u8],
) -> Result<String, StoreError> {
    let (state, _removed): (String, i64) = scripts::CANCEL
        .key(pending)
        .key(&fam.inflight)
        .key(&fam.dead)
        .key(&fam.body)
        .arg(member)
        .arg(if business.member.is_id() { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    Ok(state)
}

/// Moves a pending task to `due_ms` (`ZADD XX`): a task in flight, dead or
/// gone is not re-added. Returns the key it moved on, or `None`.
pub async fn reschedule<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    member: &[u8],
    due_ms: i64,
) -> Result<Option<String>, StoreError> {
    let score = score_of(due_ms, business.score_unit);
    for key in search_order(&business.keys(), member) {
        if let Some(t) = tenant_sets::find_for(conn, business, &key, member).await? {
            if tenant_sets::reschedule(conn, &key, &t, member, score).await? {
                return Ok(Some(String::from_utf8_lossy(&t.set).into_owned()));
            }
        }
        let (_, now): (i64, Option<f64>) = redis::pipe()
            .atomic()
            .cmd("ZADD")
            .arg(&key)
            .arg("XX")
            .arg(score)
            .arg(member)
            .zscore(&key, member)
            .query_async(conn)
            .await?;
        if now.is_some() {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

/// Bounds of a listing, epoch ms; `None` is open.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range {
    /// Earliest due time listed.
    pub from_ms: Option<i64>,
    /// Latest due time listed.
    pub to_ms: Option<i64>,
}

impl Range {
    /// The range, or why not when it starts after it ends (named by the
    /// words the caller knows its bounds by): such a range picks nothing,
    /// which is a mistake better named than answered with an empty page.
    pub fn ordered(self, from: &str, to: &str) -> Result<Self, String> {
        match (self.from_ms, self.to_ms) {
            (Some(f), Some(t)) if f > t => Err(format!(
                "{from} ({f}) is after {to} ({t}): no due time lies between; swap them"
            )),
            _ => Ok(self),
        }
    }
}

/// One page of pending tasks in due order, merged over the shards and, on
/// a business with tenants, over each key's `K` and the sets of its
/// [`tenant_sets::LISTED_TENANTS`] tenants due earliest (only `tenant`'s
/// sets when one is named).
///
/// The cursor is the (score, member) of the last task shown, which orders
/// every set alike. Sets are read a little at a time ([`Merge`]), and a
/// tenant's set only once its index score could be on the page, so a page
/// reads about what it shows plus one task per set that reaches it. A
/// page starts no read after [`search::PAGE_TIME`] once it holds a task,
/// so a page of large body-mode members may be short, with a cursor.
pub async fn list<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    range: Range,
    limit: usize,
    cursor: Option<&str>,
    tenant: Option<&str>,
) -> Result<Page, StoreError> {
    let unit = business.score_unit;
    let bound = |ms: Option<i64>, open: &str| match ms {
        Some(ms) => format!("{}", score_of(ms, unit)),
        None => open.to_string(),
    };
    let (lo, hi) = (bound(range.from_ms, "-inf"), bound(range.to_ms, "+inf"));
    let start = match cursor {
        Some(c) => decode_cursor(c)?,
        None => (String::new(), Glimpse::whole(Vec::new())),
    };
    let sets =
        tenant_sets::pending_sets(conn, business, tenant, tenant_sets::LISTED_TENANTS).await?;
    let floors = sets
        .iter()
        .map(|s| {
            s.floor.map(|f| Listed {
                member: Glimpse::whole(Vec::new()),
                score: format!("{f}"),
                due_ms: 0,
            })
        })
        .collect();
    let mut merge = Merge::new(sets.len(), limit.max(1), |a: &Listed, b: &Listed| {
        // Redis's own order: score, then the member's bytes.
        score_num(&a.score)
            .total_cmp(&score_num(&b.score))
            .then_with(|| a.member.cmp(&b.member))
    })
    .with_floors(floors);
    // Each call copies at most about 8 MiB of members in Redis (list.lua);
    // a page of many large ones stops short, with a cursor, rather than
    // hold Redis for seconds.
    let started = std::time::Instant::now();
    while let Some((set, n)) = merge.wants() {
        if merge.taken() > 0 && started.elapsed() >= search::PAGE_TIME {
            break;
        }
        let (cs, cm) = match merge.last(set) {
            Some(t) => (t.score.as_str(), &t.member),
            None => (start.0.as_str(), &start.1),
        };
        let reply: Vec<redis::Value> = scripts::LIST
            .key(&sets[set].key)
            .arg(&lo)
            .arg(&hi)
            .arg(n)
            .arg(cs)
            .arg(&cm.head)
            .arg(cm.digest_arg())
            .invoke_async(conn)
            .await?;
        let mut it = reply.into_iter();
        let more = matches!(it.next(), Some(redis::Value::Int(1)));
        let mut got = Vec::new();
        while let Some(member) = Glimpse::read(&mut it)? {
            let score = String::from_utf8_lossy(&bulk(it.next().unwrap_or(redis::Value::Nil))?)
                .into_owned();
            let due_ms = to_ms(score_num(&score), unit);
            got.push(Listed {
                member,
                score,
                due_ms,
            });
        }
        merge.fill(set, got, more);
    }
    let (tasks, more) = merge.finish();
    let cursor = if more {
        tasks.last().map(|t| encode_cursor(&t.score, &t.member))
    } else {
        None
    };
    Ok(Page { tasks, cursor })
}

fn score_num(s: &str) -> f64 {
    match s {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => s.parse().unwrap_or(f64::NAN),
    }
}

fn bulk(v: redis::Value) -> Result<Vec<u8>, StoreError> {
    match v {
        redis::Value::BulkString(b) => Ok(b),
        redis::Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(StoreError::Reply(format!("list: {other:?}"))),
    }
}

/// `SCORE:HEXMEMBER`, or `SCORE:HEXSTART:SHA1` for a member longer than a
/// glimpse: opaque to users, exact for any member bytes, and bounded.
fn encode_cursor(score: &str, member: &Glimpse) -> String {
    match &member.digest {
        None => format!("{score}:{}", hex(&member.head)),
        Some(d) => format!("{score}:{}:{d}", hex(&member.head)),
    }
}

fn decode_cursor(c: &str) -> Result<(String, Glimpse), StoreError> {
    let bad = || {
        StoreError::Reply(format!(
            "--cursor \"{c}\" is not a cursor delayd list printed"
        ))
    };
    let (score, hex) = c.split_once(':').ok_or_else(bad)?;
    if score_num(score).is_nan() {
        return Err(bad());
    }
    Ok((score.to_string(), glimpse_of(hex).ok_or_else(bad)?))
}

/// A cursor's member: its bytes in hex, or the hex of its first
/// [`Glimpse::BYTES`] bytes, `:` and its SHA-1 (a cursor does not carry
/// its size).
pub(crate) fn glimpse_of(text: &str) -> Option<Glimpse> {
    match text.split_once(':') {
        None => Some(Glimpse::whole(unhex(text)?)),
        Some((head, digest)) => {
            let head = unhex(head)?;
            let ok = head.len() == Glimpse::BYTES
                && digest.len() == 40
                && digest.bytes().all(|b| b.is_ascii_hexdigit());
            ok.then(|| Glimpse {
                head,
                size: 0,
                digest: Some(digest.to_string()),
            })
        }
    }
}

/// Bytes as lower-case hex: how cursors and the API's handles carry a
/// member exactly, whatever its bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `text` spells in hex, or `None` when it is not an even number
/// of hex digits (text from a user, so any characters at all).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// Whether `c` is a cursor `delayd list` could have printed.
pub fn valid_cursor(c: &str) -> bool {
    decode_cursor(c).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_any_bytes() {
        let member = Glimpse::whole(b"id:\x00\xff".to_vec());
        let c = encode_cursor("1767323045000", &member);
        assert_eq!(
            decode_cursor(&c).unwrap(),
            ("1767323045000".to_string(), member)
        );
        let long = Glimpse {
            head: vec![0xff; Glimpse::BYTES],
            size: 0,
            digest: Some("0a".repeat(20)),
        };
        let c = encode_cursor("7", &long);
        assert!(c.len() < 2 * Glimpse::BYTES + 64, "a cursor is bounded");
        assert_eq!(decode_cursor(&c).unwrap(), ("7".to_string(), long));
        assert!(
            decode_cursor("7:00:abc").is_err(),
            "a digest needs a whole start"
        );
        assert!(decode_cursor("nonsense").is_err());
        assert!(decode_cursor("12:abc").is_err());
        assert!(decode_cursor("x:00").is_err());
        assert!(valid_cursor("-inf:"));
    }

    #[test]
    fn a_cursor_with_text_that_is_not_hex_is_refused_never_a_panic() {
        for c in ["1:aéb", "1:é", "1:0é", "1:+1", "1:éé"] {
            assert!(decode_cursor(c).is_err(), "{c}");
            assert!(!valid_cursor(c), "{c}");
        }
    }

    #[test]
    fn dead_reasons_give_their_attempts() {
        assert_eq!(
            attempts_in("returned as unroutable (312 NO_ROUTE) after 5 attempts"),
            Some(5)
        );
        assert_eq!(attempts_in("no body"), None);
    }

    #[test]
    fn one_shard_is_the_key_and_many_spread_by_hash() {
        let one = vec!["k".to_string()];
        assert_eq!(shard_of(&one, b"a"), "k");
        let many: Vec<String> = (0..4).map(|i| format!("k:{i}")).collect();
        let order = search_order(&many, b"task-1");
        assert_eq!(order.len(), 4);
        assert_eq!(order[0], shard_of(&many, b"task-1"));
    }
}
