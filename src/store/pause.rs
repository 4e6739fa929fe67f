//! An operator's pause of a business: one key per key family, which the
//! claim script reads, so every instance stops claiming with no extra
//! command on its hot path. Pending work stays where it is.

use super::{Paused, Store, StoreError};

impl Store {
    /// Pauses this key family, recording when (Redis's clock) and `by`;
    /// a family paused already keeps its first record. Returns whether
    /// this call paused it.
    pub async fn pause(&self, by: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let since_ms = secs * 1000 + micros / 1000;
        let set: Option<String> = redis::cmd("SET")
            .arg(&self.keys.paused)
            .arg(format!("{since_ms} {by}"))
            .arg("NX")
            .query_async(&mut conn)
            .await?;
        Ok(set.is_some())
    }

    /// Lets claims run again; returns whether the family was paused.
    pub async fn resume(&self) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let gone: i64 = redis::cmd("DEL")
            .arg(&self.keys.paused)
            .query_async(&mut conn)
            .await?;
        Ok(gone == 1)
    }

    /// Whether this key family is paused, and since when and by whom.
    pub async fn paused(&self) -> Result<Option<Paused>, StoreError> {
        let mut conn = self.conn.clone();
        let v: Option<String> = redis::cmd("GET")
            .arg(&self.keys.paused)
            .query_async(&mut conn)
            .await?;
        Ok(v.as_deref().and_then(Paused::parse))
    }
}
