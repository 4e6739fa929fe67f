//! Due times as people write them: a duration from now (`30s`), an RFC 3339
//! time or epoch milliseconds. Errors are the reason alone; each caller
//! names the field (`--in`, `"in"`).

use std::time::Duration;

/// A duration such as `250ms`, `30s` or `5m`.
pub fn parse_in(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e}; write e.g. 250ms, 30s or 5m"))
}

/// Epoch milliseconds or an RFC 3339 time, as epoch milliseconds.
pub fn parse_at(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.trim().parse::<i64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(s.trim())
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        })
        .map_err(|e| format!("{e}; give RFC 3339 (2026-01-02T03:04:05Z) or epoch milliseconds"))
}

/// `now_ms` plus `d`, saturating.
pub fn after(now_ms: i64, d: Duration) -> i64 {
    now_ms.saturating_add(d.as_millis().min(i64::MAX as u128) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_accepts_epoch_ms_and_rfc3339() {
        assert_eq!(parse_at("1700000000000").ok(), Some(1_700_000_000_000));
        assert_eq!(parse_at("1970-01-01T00:00:01Z").ok(), Some(1000));
        assert!(parse_at("tomorrow").is_err());
    }

    #[test]
    fn in_is_a_duration() {
        assert_eq!(parse_in("250ms").ok(), Some(Duration::from_millis(250)));
        assert!(parse_in("soon").unwrap_err().contains("30s"));
        assert_eq!(after(i64::MAX - 1, Duration::from_secs(1)), i64::MAX);
    }
}
