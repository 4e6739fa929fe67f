//! Where a task waits on a business with tenants: in its tenant's sorted
//! set until a claim moves it into `K`. The by-id operations look there
//! first: a member only ever moves from a tenant's set into `K`, so a miss
//! there followed by a look at `K` sees every task once.

use redis::aio::ConnectionLike;

use crate::config::Business;
use crate::keys::KeyFamily;
use crate::store::StoreError;

/// Most tenants one look-up reads, those whose earliest member is earliest
/// first, so a look-up costs at most this many `ZSCORE`s: a task of a
/// tenant beyond them is not found by id until a claim moves it into `K`
/// (docs/tenants.md).
pub const MOST_TENANTS: usize = 10_000;

/// Tenants asked about per round trip.
const PER_CALL: usize = 500;

/// A task found in a tenant's set.
#[derive(Debug, Clone, PartialEq)]
pub struct InTenant {
    /// The tenant's name.
    pub tenant: Vec<u8>,
    /// Its set's key.
    pub set: Vec<u8>,
    /// The task's score there.
    pub score: f64,
}

/// [`find`] on a business with tenants; nothing on one without.
pub async fn find_for<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    key: &str,
    member: &[u8],
) -> Result<Option<InTenant>, StoreError> {
    if business.tenants.is_none() {
        return Ok(None);
    }
    find(conn, key, member).await
}

/// The tenant set of `key`'s family that holds `member`, if any, among the
/// first [`MOST_TENANTS`] tenants of its index.
pub async fn find<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    member: &[u8],
) -> Result<Option<InTenant>, StoreError> {
    Ok(find_each(conn, key, &[member]).await?.pop().flatten())
}

/// [`find`] for each of `members`, reading the index once: the tenant set
/// that holds each, in the same order. At most `PER_CALL` `ZSCORE`s go
/// in one round trip, asked only for the members not found yet.
pub async fn find_each<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    members: &[&[u8]],
) -> Result<Vec<Option<InTenant>>, StoreError> {
    let fam = KeyFamily::new(key);
    let mut found: Vec<Option<InTenant>> = vec![None; members.len()];
    if members.is_empty() {
        return Ok(found);
    }
    let tenants: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(fam.tenant_index())
        .arg(0)
        .arg(MOST_TENANTS - 1)
        .query_async(conn)
        .await?;
    let mut at = 0;
    while at < tenants.len() {
        let missing: Vec<usize> = (0..members.len()).filter(|&i| found[i].is_none()).collect();
        if missing.is_empty() {
            break;
        }
        let chunk = &tenants[at..tenants.len().min(at + (PER_CALL / missing.len()).max(1))];
        at += chunk.len();
        let mut pipe = redis::pipe();
        for t in chunk {
            for &i in &missing {
                pipe.zscore(fam.tenant_set(t), members[i]);
            }
        }
        let scores: Vec<Option<f64>> = pipe.query_async(conn).await?;
        let mut scores = scores.into_iter();
        for t in chunk {
            for &i in &missing {
                if let (Some(score), None) = (scores.next().flatten(), &found[i]) {
                    found[i] = Some(InTenant {
                        tenant: t.clone(),
                        set: fam.tenant_set(t),
                        score,
                    });
                }
            }
        }
    }
    Ok(found)
}

/// Moves `member` in its tenant's set to `score` (`ZADD XX`) and lowers
/// the tenant's index entry to it when earlier, in one transaction; false
/// when a claim took it meanwhile. A later score leaves the index entry
/// early, which the next claim repairs.
pub async fn reschedule<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    found: &InTenant,
    member: &[u8],
    score: f64,
) -> Result<bool, StoreError> {
    let fam = KeyFamily::new(key);
    let (_, _, now): (i64, i64, Option<f64>) = redis::pipe()
        .atomic()
        .cmd("ZADD")
        .arg(&found.set)
        .arg("XX")
        .arg(score)
        .arg(member)
        .cmd("ZADD")
        .arg(fam.tenant_index())
        .arg("XX")
        .arg("LT")
        .arg(score)
        .arg(&found.tenant)
        .zscore(&found.set, member)
        .query_async(conn)
        .await?;
    Ok(now.is_some())
}

/// Most tenants of each key a listing without a named tenant merges, those
/// due earliest: a page reads about one member of each whose earliest due
/// time could be on it, so the bound keeps a page's reads bounded.
pub const LISTED_TENANTS: usize = 1_000;

/// One sorted set pending tasks wait in, named so a walk can resume at it
/// whatever sets came or went meanwhile: shard `shard`'s `K` (`tenant`
/// `None`, first) or one of its tenants' sets, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SetAt {
    /// The business's key (shard) index.
    pub shard: usize,
    /// The tenant whose set it is; `None` for `K`.
    pub tenant: Option<String>,
}

impl SetAt {
    /// `SHARD` or `SHARD/HEXTENANT`: no `:`, so it fits inside cursors.
    pub fn encode(&self) -> String {
        match &self.tenant {
            None => self.shard.to_string(),
            Some(t) => format!("{}/{}", self.shard, super::hex(t.as_bytes())),
        }
    }

    /// What [`SetAt::encode`] wrote, naming a shard below `shards`.
    pub fn decode(text: &str, shards: usize) -> Option<Self> {
        let (shard, tenant) = match text.split_once('/') {
            Some((s, hex)) => {
                let name = String::from_utf8(super::unhex(hex)?).ok()?;
                (s, Some(name))
            }
            None => (text, None),
        };
        let shard = shard.parse().ok().filter(|s| *s < shards)?;
        Some(Self { shard, tenant })
    }
}

/// One set of [`pending_sets`].
#[derive(Debug, Clone)]
pub struct PendingSet {
    /// Which it is.
    pub at: SetAt,
    /// Its key.
    pub key: String,
    /// A floor under its members' scores, when known (a tenant's index
    /// score); `None` for `K`.
    pub floor: Option<f64>,
}

/// The sets `business`'s pending tasks wait in, in [`SetAt`] order: each
/// key alone without tenants; with them each key's `K` and the sets of the
/// first `most` tenants of its index, or only `tenant`'s set on each key.
pub async fn pending_sets<C: ConnectionLike>(
    conn: &mut C,
    business: &Business,
    tenant: Option<&str>,
    most: usize,
) -> Result<Vec<PendingSet>, StoreError> {
    let mut out = Vec::new();
    for (shard, key) in business.keys().iter().enumerate() {
        let fam = KeyFamily::new(key);
        let tenant_set = |name: &str, floor| PendingSet {
            at: SetAt {
                shard,
                tenant: Some(name.to_string()),
            },
            key: String::from_utf8_lossy(&fam.tenant_set(name.as_bytes())).into_owned(),
            floor,
        };
        if let Some(t) = tenant {
            out.push(tenant_set(t, None));
            continue;
        }
        out.push(PendingSet {
            at: SetAt {
                shard,
                tenant: None,
            },
            key: key.clone(),
            floor: None,
        });
        if business.tenants.is_some() {
            let names = crate::store::indexed(conn, key, most).await?;
            out.extend(names.iter().map(|t| tenant_set(&t.name, Some(t.floor))));
        }
    }
    Ok(out)
}

/// Where a walk resumes among `sets` (in order): the index of `at`, or of
/// the first set after it when it is gone, and whether it is `at` itself
/// (so the position inside it still holds).
pub fn resume_at(sets: &[SetAt], at: &SetAt) -> (usize, bool) {
    let i = sets.partition_point(|s| s < at);
    (i, sets.get(i) == Some(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(shard: usize, tenant: Option<&str>) -> SetAt {
        SetAt {
            shard,
            tenant: tenant.map(str::to_string),
        }
    }

    #[test]
    fn a_set_name_round_trips_and_k_comes_before_its_tenants() {
        for a in [at(0, None), at(3, Some("acme:eu/1")), at(1, Some("ü"))] {
            assert_eq!(SetAt::decode(&a.encode(), 4), Some(a));
        }
        assert_eq!(SetAt::decode("4", 4), None, "no such shard");
        assert_eq!(SetAt::decode("0/ff", 4), None, "not text");
        assert!(at(0, None) < at(0, Some("a")) && at(0, Some("z")) < at(1, None));
    }

    #[test]
    fn a_walk_resumes_at_its_set_or_the_next_one_when_it_is_gone() {
        let sets = [at(0, None), at(0, Some("a")), at(0, Some("c")), at(1, None)];
        assert_eq!(resume_at(&sets, &at(0, Some("a"))), (1, true));
        assert_eq!(resume_at(&sets, &at(0, Some("b"))), (2, false));
        assert_eq!(resume_at(&sets, &at(0, Some("d"))), (3, false));
        assert_eq!(resume_at(&sets, &at(2, None)), (4, false));
    }
}
