//! Text for people: bytes shown as text, durations in words. The commands
//! and the HTTP API both show tasks with these.

use std::time::Duration;

/// Bytes as JSON text: the string itself when it is UTF-8, escaped when not.
pub fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => escape_bytes(b),
    }
}

/// Shows bytes as text where printable, `\xNN` where not.
pub fn escape_bytes(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

/// Text with its control characters escaped (`\u{1b}`), so that a line
/// quoting a user's value stays one line and cannot drive a terminal.
pub fn visible(s: &str) -> String {
    s.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// An epoch-ms time as UTC RFC 3339 with milliseconds, for operators
/// comparing due times; the number itself when out of range.
pub fn utc_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// A duration in words ("1h 5m"), "-" for none, "far future" past a century.
pub fn human_ms(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms > 100 * 365 * 86_400_000 => "far future".into(),
        Some(ms) => humantime::format_duration(Duration::from_millis(ms as u64)).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_shows_binary_safely() {
        assert_eq!(escape_bytes(b"ok\x00\xff"), "ok\\x00\\xff");
    }
}
