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
    let fam = KeyFamily::new(key);
    let tenants: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(fam.tenant_index())
        .arg(0)
        .arg(MOST_TENANTS - 1)
        .query_async(conn)
        .await?;
    for chunk in tenants.chunks(PER_CALL) {
        let mut pipe = redis::pipe();
        for t in chunk {
            pipe.zscore(fam.tenant_set(t), member);
        }
        let scores: Vec<Option<f64>> = pipe.query_async(conn).await?;
        let hit = chunk.iter().zip(scores).find_map(|(t, s)| {
            s.map(|score| InTenant {
                tenant: t.clone(),
                set: fam.tenant_set(t),
                score,
            })
        });
        if hit.is_some() {
            return Ok(hit);
        }
    }
    Ok(None)
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
