//! An operator's hold on one tenant of a business with tenants: pausing it,
//! setting its weight or `max_rate` at run time, and a page of tenants with
//! their counts.
//! Each lives in a hash under `K`'s hash tag that `claim_tenants.lua` reads
//! in the claim it runs anyway, so none adds a command to the hot path.

use super::tenants::{parsed, per_tenant};
use super::{int_of, scripts, Paused, Store, StoreError};
use crate::config::TenantSetting;

/// One tenant as a listing shows it (one key's view; a business with
/// shards adds its keys' views up, `crate::tasks::tenants`).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRow {
    /// The tenant's name.
    pub tenant: Vec<u8>,
    /// Its members waiting in its set.
    pub pending: u64,
    /// How many of them are due now.
    pub due: u64,
    /// Due time of its earliest member, epoch ms.
    pub head_ms: Option<i64>,
    /// The operator's pause, if paused.
    pub paused: Option<Paused>,
    /// Its weight set at run time, if any (else the config's).
    pub weight: Option<u32>,
    /// Members claims moved out of its set in the last whole second.
    pub released_per_s: u64,
    /// Its `max_rate` set at run time, if any (else the config's).
    pub max_rate: Option<u32>,
}

/// A page of one key's tenants, and what is around it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantPage {
    /// Redis's clock when it was read, epoch ms.
    pub now_ms: i64,
    /// Tenants in the index (those with pending members).
    pub tenants: u64,
    /// Tenants paused, with or without pending members.
    pub paused: u64,
    /// The page, in index order: the earliest head first.
    pub rows: Vec<TenantRow>,
}

impl Store {
    /// Pauses `tenant`, recording when (Redis's clock) and `by`; a tenant
    /// paused already keeps its first record. Returns whether this call
    /// paused it.
    pub async fn pause_tenant(&self, tenant: &[u8], by: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let set: i64 = redis::cmd("HSETNX")
            .arg(self.keys.tenant_paused())
            .arg(tenant)
            .arg(format!("{} {by}", secs * 1000 + micros / 1000))
            .query_async(&mut conn)
            .await?;
        Ok(set == 1)
    }

    /// Lets a paused tenant's members be claimed again; returns whether it
    /// was paused.
    pub async fn resume_tenant(&self, tenant: &[u8]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let was: i64 = scripts::TENANT_RESUME
            .key(self.keys.tenant_paused())
            .key(self.keys.tenant_index())
            .key(self.keys.tenant_set(tenant))
            .arg(tenant)
            .invoke_async(&mut conn)
            .await?;
        Ok(was == 1)
    }

    /// Sets `tenant`'s `setting` from now on, or with `None` returns it to
    /// the config's; returns the value set at run time before.
    pub async fn set_tenant(
        &self,
        setting: TenantSetting,
        tenant: &[u8],
        value: Option<u32>,
    ) -> Result<Option<u32>, StoreError> {
        let mut conn = self.conn.clone();
        let key = match setting {
            TenantSetting::Weight => self.keys.tenant_weights(),
            TenantSetting::MaxRate => self.keys.tenant_max_rates(),
        };
        let mut pipe = redis::pipe();
        pipe.atomic().hget(&key, tenant);
        match value {
            Some(v) => pipe.hset(&key, tenant, v).ignore(),
            None => pipe.hdel(&key, tenant).ignore(),
        };
        let (before,): (Option<String>,) = pipe.query_async(&mut conn).await?;
        Ok(before.and_then(|b| b.parse().ok()))
    }

    /// Up to `limit` tenants from rank `offset` of the index (the earliest
    /// head first), with their counts; the caller bounds `limit`.
    pub async fn tenants_page(&self, offset: u64, limit: u64) -> Result<TenantPage, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = scripts::TENANTS_LIST
            .key(self.keys.tenant_index())
            .key(self.keys.tenant_paused())
            .key(self.keys.tenant_weights())
            .key(self.keys.tenant_released())
            .key(self.keys.tenant_max_rates())
            .arg(self.keys.tenant_prefix())
            .arg(offset)
            .arg(limit.max(1))
            .arg(self.unit.millis())
            .invoke_async(&mut conn)
            .await?;
        let mut it = reply.into_iter();
        let now_ms = int_of(it.next())?;
        let tenants = int_of(it.next())?.max(0) as u64;
        let paused = int_of(it.next())?.max(0) as u64;
        let rows = match it.next() {
            Some(redis::Value::Array(a)) => self.rows(a)?,
            other => return Err(StoreError::Reply(format!("tenant rows {other:?}"))),
        };
        Ok(TenantPage {
            now_ms,
            tenants,
            paused,
            rows,
        })
    }

    /// `{tenant, pending, due, head score or '', paused or '', weight or
    /// '', released, max_rate or '', ...}` as `tenants_list.lua` returns it.
    fn rows(&self, a: Vec<redis::Value>) -> Result<Vec<TenantRow>, StoreError> {
        let text = |v: Option<redis::Value>| match v {
            Some(redis::Value::BulkString(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(StoreError::Reply(format!("tenant field {other:?}"))),
        };
        let unit_ms = self.unit.millis() as f64;
        per_tenant(a, 8, |tenant, it| {
            Ok(TenantRow {
                tenant,
                pending: int_of(it.next())?.max(0) as u64,
                due: int_of(it.next())?.max(0) as u64,
                head_ms: parsed::<f64>(it.next(), "head")?.map(|s| (s * unit_ms) as i64),
                paused: Paused::parse(&text(it.next())?),
                weight: parsed(it.next(), "weight")?,
                released_per_s: int_of(it.next())?.max(0) as u64,
                max_rate: parsed(it.next(), "max_rate")?,
            })
        })
    }
}
