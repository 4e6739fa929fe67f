//! What comes due when: counts of pending members per window ahead, for
//! the console's histogram.

use super::{int_of, Store, StoreError};
use crate::redis_conn::scripts::HISTOGRAM;

/// Pending members per window from now, as one script call counts them.
#[derive(Debug, Clone, Default)]
pub struct DueCounts {
    /// Redis's clock, epoch ms.
    pub now_ms: i64,
    /// One count per window: due by the first end (overdue included), then
    /// between consecutive ends, then after the last end.
    pub counts: Vec<u64>,
}

impl Store {
    /// Counts pending members per window, `ends_ms` being the windows' ends
    /// as ms from now, ascending: `ends_ms.len() + 1` counts, one `ZCOUNT`
    /// each, whatever the number pending.
    pub async fn due_counts(&self, ends_ms: &[u64]) -> Result<DueCounts, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = HISTOGRAM.prepare_invoke();
        inv.key(&self.keys.pending).arg(self.unit.millis());
        for e in ends_ms {
            inv.arg(*e);
        }
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await?;
        let mut it = reply.into_iter();
        let now_ms = int_of(it.next())?;
        let counts = it
            .map(|v| int_of(Some(v)).map(|n| n.max(0) as u64))
            .collect::<Result<Vec<_>, _>>()?;
        if counts.len() != ends_ms.len() + 1 {
            return Err(StoreError::Reply(format!(
                "histogram: {} counts for {} windows",
                counts.len(),
                ends_ms.len() + 1
            )));
        }
        Ok(DueCounts { now_ms, counts })
    }
}
