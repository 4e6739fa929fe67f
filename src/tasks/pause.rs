//! Pausing and resuming a business over all its keys, for the CLI and the
//! API: no instance claims from a paused business; its pending work stays,
//! and expired leases still come back to pending.

use crate::store::{Paused, Store, StoreError};

/// Pauses every key of a business, recording `by`; returns how many keys
/// this call paused (0: it was paused already).
pub async fn pause(stores: &[Store], by: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for s in stores {
        n += s.pause(by).await? as usize;
    }
    Ok(n)
}

/// Resumes every key of a business; returns how many keys were paused.
pub async fn resume(stores: &[Store]) -> Result<usize, StoreError> {
    let mut n = 0;
    for s in stores {
        n += s.resume().await? as usize;
    }
    Ok(n)
}

/// Whether a business is paused: the earliest pause of any of its keys
/// (a key left paused by an interrupted call counts too).
pub async fn state(stores: &[Store]) -> Result<Option<Paused>, StoreError> {
    let mut first: Option<Paused> = None;
    for s in stores {
        if let Some(p) = s.paused().await? {
            if first.as_ref().is_none_or(|f| p.since_ms < f.since_ms) {
                first = Some(p);
            }
        }
    }
    Ok(first)
}
