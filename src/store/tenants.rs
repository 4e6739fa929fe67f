//! The Redis side of a business with tenants: one script call that moves
//! the chosen tenants' due members into `K`, claims as `claim.lua` does, and
//! reports which tenants have due work (see `src/lua/claim_tenants.lua`).
//! Which tenant gets how many is decided above, in `crate::tenants`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::{int_of, parse_claim, scripts, Claim, Store, StoreError};

/// A tenant whose earliest member is due, as a claim saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantDue {
    /// The tenant's name, as producers wrote it into the index.
    pub tenant: Vec<u8>,
    /// How many of its members were due.
    pub due: u64,
    /// Its virtual time, shared by every instance; `None` until it is first
    /// served after an idle spell.
    pub vtime: Option<f64>,
    /// Its weight set at run time, in place of the config's.
    pub weight: Option<u32>,
    /// Its `max_rate` set at run time, in place of the config's.
    pub max_rate: Option<u32>,
}

/// How many due members to move out of one tenant's set in a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantTake {
    /// The tenant.
    pub tenant: Vec<u8>,
    /// Most members to move.
    pub count: u64,
    /// The share gave it all it had due at the last report: it also moves
    /// what fell due since, as a tenant newly due gets its first member at
    /// once, rather than leaving it a claim behind the backlogged ones.
    pub rest: bool,
    /// Its weight: its virtual time advances by moved / weight.
    pub weight: u32,
    /// The most it may move in this claim in all, also out of what other
    /// tenants leave (`None`: no bound; `Some(0)` holds it back).
    pub most: Option<u64>,
}

/// The earliest head among the tenants a claim could release, as
/// `tenants_head.lua` read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantsHead {
    /// Redis's clock at the read, epoch ms.
    pub now_ms: i64,
    /// The head's due time, epoch ms; `None` when no such tenant is left.
    pub head_ms: Option<i64>,
    /// How many of those tenants were due.
    pub due: usize,
}

/// A tenant of a key's index with its index score: a floor under its
/// members' due times (a claim or a later reschedule may leave it early,
/// never late).
#[derive(Debug, Clone, PartialEq)]
pub struct Indexed {
    /// The tenant's name.
    pub name: String,
    /// Its index score.
    pub floor: f64,
}

/// The first `most` tenants of `key`'s index (the earliest heads), in name
/// order: the order walks over the tenants' sets resume in. A name that
/// is not text (only a producer writing the index by hand makes one) has
/// no key name delayd can spell, so it is left out: its members are still
/// claimed and delivered.
pub async fn indexed<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    most: usize,
) -> Result<Vec<Indexed>, StoreError> {
    let got: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(crate::keys::KeyFamily::new(key).tenant_index())
        .arg(0)
        .arg(most.max(1) - 1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    let mut out: Vec<Indexed> = got
        .into_iter()
        .filter_map(|(t, floor)| {
            Some(Indexed {
                name: String::from_utf8(t).ok()?,
                floor,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The release budget of a tenant with a `max_rate` on one key: the µs
/// between two releases, and how many its budget holds when full (100 ms of
/// the rate, at least 2), which `claim_tenants.lua` draws on and the plan
/// sizes a capped tenant's share by. Claims further apart than that lose
/// the releases in between: with 20 ms, a loaded host's bare run released
/// tenants capped at 300/s and 400/s at 285/s and 367/s.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantBudget {
    /// The tenant.
    pub tenant: String,
    /// µs between two of its releases on this key.
    pub interval_us: f64,
    /// Releases the budget holds when full.
    pub burst: u64,
}

impl TenantBudget {
    /// `tenant`'s budget at `rate` a second over `shards` keys: each key's
    /// holds it to `rate / shards`.
    pub fn new(tenant: &str, rate: u32, shards: usize) -> Self {
        let interval_us = 1e6 * shards.max(1) as f64 / f64::from(rate.max(1));
        Self {
            tenant: tenant.to_string(),
            interval_us,
            burst: ((100_000.0 / interval_us).floor() as u64).max(2),
        }
    }
}

impl Store {
    /// Moves up to `takes` due members into `K` (no more than `limit` due
    /// there in all), claims up to `limit` as [`Store::claim`] does, and
    /// returns the first `report` tenants with due work. `floor` is the
    /// virtual time a tenant returning from idle starts at; `budgets` are
    /// those of the tenants with a `max_rate`, which the script holds
    /// whatever `takes` ask.
    pub async fn claim_tenants(
        &self,
        limit: usize,
        lease: Duration,
        takes: &[TenantTake],
        (floor, report): (f64, usize),
        budgets: &[TenantBudget],
    ) -> Result<(Claim, Vec<TenantDue>), StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.claim_call(&scripts::CLAIM_TENANTS, limit, lease);
        inv.key(self.keys.tenant_index())
            .key(self.keys.tenant_clock())
            .key(self.keys.tenant_paused())
            .key(self.keys.tenant_weights())
            .key(self.keys.tenant_rate())
            .key(self.keys.tenant_released())
            .key(self.keys.tenant_max_rates());
        for t in takes {
            inv.key(self.keys.tenant_set(&t.tenant));
        }
        inv.arg(self.keys.tenant_prefix())
            .arg(report)
            .arg(floor.to_string())
            .arg(budgets.len());
        for b in budgets {
            inv.arg(&b.tenant)
                .arg(b.interval_us.to_string())
                .arg(b.burst);
        }
        for t in takes {
            let count = format!("{}{}", t.count, if t.rest { "+" } else { "" });
            inv.arg(&t.tenant[..])
                .arg(count)
                .arg(t.weight.max(1))
                .arg(t.most.map(|m| m.to_string()).unwrap_or_default());
        }
        let mut reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        let state = match reply.pop() {
            Some(redis::Value::Array(a)) => parse_due(a)?,
            other => return Err(StoreError::Reply(format!("tenants {other:?}"))),
        };
        let owners = match reply.pop() {
            Some(redis::Value::Array(a)) => a,
            other => return Err(StoreError::Reply(format!("owners {other:?}"))),
        };
        let mut claim = parse_claim(reply, self.member.is_id())?;
        attribute(&mut claim, owners)?;
        Ok((claim, state))
    }

    /// Due time of the earliest member of a tenant neither paused nor in
    /// `held`, epoch ms, from the index: what a wake-up hint compares with
    /// besides `K`'s head.
    pub async fn tenants_head_due_ms(&self, held: &[Vec<u8>]) -> Result<Option<i64>, StoreError> {
        Ok(self.tenants_head(held, 0).await?.head_ms)
    }

    /// The earliest head of a tenant neither paused nor in `passed`, with
    /// Redis's clock and how many such tenants are due (at most `most`).
    pub async fn tenants_head(
        &self,
        passed: &[Vec<u8>],
        most: usize,
    ) -> Result<TenantsHead, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = scripts::TENANTS_HEAD.key(self.keys.tenant_index());
        inv.key(self.keys.tenant_paused())
            .arg(self.unit.millis())
            .arg(most)
            .arg(passed);
        let (now_ms, head, due): (i64, String, usize) = inv.invoke_async(&mut conn).await?;
        let head_ms = match head.as_str() {
            "" => None,
            s => Some(
                (s.parse::<f64>()
                    .map_err(|_| StoreError::Reply(format!("tenants head {s:?}")))?
                    * self.unit.millis() as f64) as i64,
            ),
        };
        Ok(TenantsHead {
            now_ms,
            head_ms,
            due,
        })
    }
}

/// Names each claimed member's tenant from the script's list, one per
/// member in order ('' for a member that was already in `K`), one shared
/// name per tenant.
fn attribute(claim: &mut Claim, owners: Vec<redis::Value>) -> Result<(), StoreError> {
    if owners.len() != claim.members.len() {
        return Err(StoreError::Reply(format!(
            "{} owners for {} members",
            owners.len(),
            claim.members.len()
        )));
    }
    let mut names: HashMap<Vec<u8>, Arc<[u8]>> = HashMap::new();
    for (c, o) in claim.members.iter_mut().zip(owners) {
        match o {
            redis::Value::BulkString(t) if t.is_empty() => {}
            redis::Value::BulkString(t) => {
                let name = names.entry(t).or_insert_with_key(|t| Arc::from(&t[..]));
                c.tenant = Some(name.clone());
            }
            other => return Err(StoreError::Reply(format!("owner {other:?}"))),
        }
    }
    Ok(())
}

/// `{tenant, due, vtime or '', weight or '', max_rate or '', ...}` as the
/// script reports it.
fn parse_due(a: Vec<redis::Value>) -> Result<Vec<TenantDue>, StoreError> {
    per_tenant(a, 5, |tenant, it| {
        Ok(TenantDue {
            tenant,
            due: int_of(it.next())?.max(0) as u64,
            vtime: parsed(it.next(), "vtime")?,
            weight: parsed(it.next(), "weight")?,
            max_rate: parsed(it.next(), "max_rate")?,
        })
    })
}

/// The rows of a script's flat reply of `width` values per tenant, its
/// name first: `row` reads the rest of each from the reply.
pub(super) fn per_tenant<T>(
    a: Vec<redis::Value>,
    width: usize,
    mut row: impl FnMut(Vec<u8>, &mut std::vec::IntoIter<redis::Value>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::with_capacity(a.len() / width);
    let mut it = a.into_iter();
    while let Some(t) = it.next() {
        let redis::Value::BulkString(tenant) = t else {
            return Err(StoreError::Reply(format!("tenant {t:?}")));
        };
        out.push(row(tenant, &mut it)?);
    }
    Ok(out)
}

/// A number the script returns as text, `''` for none.
pub(super) fn parsed<T: std::str::FromStr>(
    v: Option<redis::Value>,
    what: &str,
) -> Result<Option<T>, StoreError> {
    match v {
        Some(redis::Value::BulkString(b)) => Ok(std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.parse::<T>().ok())),
        other => Err(StoreError::Reply(format!("{what} {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_holds_100_ms_of_its_rate_per_key_and_at_least_2() {
        let b = TenantBudget::new("acme", 400, 1);
        assert_eq!((b.interval_us, b.burst), (2500.0, 40));
        let sharded = TenantBudget::new("acme", 400, 4);
        assert_eq!((sharded.interval_us, sharded.burst), (10_000.0, 10));
        assert_eq!(TenantBudget::new("slow", 10, 1).burst, 2);
    }
}
