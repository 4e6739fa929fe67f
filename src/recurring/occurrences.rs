//! When a schedule's occurrences fall, as instants (epoch ms), with the
//! daylight-saving rules delayd promises:
//!
//! - an occurrence whose wall-clock time falls in a spring-forward gap fires
//!   once, at the first valid instant after the gap (a fixed-time job such
//!   as `30 2 * * *` runs at 03:00 that day); an interval job (`*/15` in a
//!   time field) keeps its real-time rhythm, so the gap's occurrences do not
//!   pile up after it;
//! - a wall-clock time that happens twice in a fall-back overlap fires once,
//!   at its first instant, for every kind of job.
//!
//! The cron arithmetic and the first rule are croner's; the second is
//! applied here for interval jobs, which croner runs in both passes.

use chrono::offset::LocalResult;
use chrono::{DateTime, TimeZone};
use chrono_tz::Tz;

use crate::config::recurring_section::Schedule;

/// Occurrences of `s` after `after_ms` (exclusive) and at most `until_ms`,
/// oldest first, at most `limit` of them.
pub fn between(s: &Schedule, after_ms: i64, until_ms: i64, limit: usize) -> Vec<i64> {
    let Some(start) = s.tz.timestamp_millis_opt(after_ms).single() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in s.cron.clone().iter_after(start) {
        let ms = t.timestamp_millis();
        if ms > until_ms || out.len() >= limit {
            break;
        }
        if !is_second_pass(&t, s.tz) {
            out.push(ms);
        }
    }
    out
}

/// The latest occurrence of `s` at or before `at_ms`, if any within a year.
pub fn latest_at_or_before(s: &Schedule, at_ms: i64) -> Option<i64> {
    let at = s.tz.timestamp_millis_opt(at_ms).single()?;
    let t = s.cron.find_previous_occurrence(&at, true).ok()?;
    (at_ms - t.timestamp_millis() <= 366 * 86_400_000).then(|| t.timestamp_millis())
}

/// Whether `t` is the second instant of a wall-clock time that happens twice.
fn is_second_pass(t: &DateTime<Tz>, tz: Tz) -> bool {
    match tz.from_local_datetime(&t.naive_local()) {
        LocalResult::Ambiguous(first, _) => first != *t,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::recurring_section::{parse_cron, CatchUp};
    use chrono::NaiveDate;

    fn schedule(cron: &str, tz: Tz) -> Schedule {
        Schedule {
            name: "s".into(),
            cron_text: cron.into(),
            cron: parse_cron(cron).unwrap(),
            tz,
            body: b"b".to_vec(),
            routing_key: None,
            catch_up: CatchUp::Last,
            catch_up_window: std::time::Duration::from_secs(3600),
            write_ahead: std::time::Duration::from_secs(60),
        }
    }

    /// Epoch ms of a UTC wall-clock time.
    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        NaiveDate::from_ymd_opt(y, mo, d)
            .unwrap()
            .and_hms_opt(h, mi, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis()
    }

    /// The local wall-clock times ("HH:MM+offset") of the occurrences.
    fn local(s: &Schedule, ms: &[i64]) -> Vec<String> {
        ms.iter()
            .map(|m| {
                s.tz.timestamp_millis_opt(*m)
                    .unwrap()
                    .format("%d %H:%M%:z")
                    .to_string()
            })
            .collect()
    }

    /// Across a clock change each wall-clock time fires once: a fixed time
    /// in the spring gap right after it, one in the fall overlap at its
    /// first instant; an interval job skips the repeated times of the
    /// overlap and keeps its rhythm across the gap.
    #[test]
    fn across_a_clock_change_each_wall_clock_time_fires_once() {
        use chrono_tz::{America::New_York, Europe::Berlin};
        #[rustfmt::skip]
        let cases = [
            // Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST.
            ("30 2 * * *", Berlin, utc(2026, 3, 27, 12, 0), utc(2026, 3, 30, 12, 0), 10, &["28 02:30+01:00", "29 03:00+02:00", "30 02:30+02:00"][..]),
            // New York 2026-03-08: 02:00 EST jumps to 03:00 EDT.
            ("30 2 * * *", New_York, utc(2026, 3, 7, 12, 0), utc(2026, 3, 8, 23, 0), 10, &["08 03:00-04:00"]),
            // Berlin 2026-10-25: 03:00 CEST falls back to 02:00 CET.
            ("30 2 * * *", Berlin, utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 23, 0), 10, &["25 02:30+02:00"]),
            // New York 2026-11-01: 02:00 EDT falls back to 01:00 EST.
            ("30 1 * * *", New_York, utc(2026, 10, 31, 12, 0), utc(2026, 11, 1, 23, 0), 10, &["01 01:30-04:00"]),
            // 00:30 EDT ... 01:30 EDT, then the repeated 01:00 and 01:30 EST
            // are skipped, and 02:00 EST follows.
            ("*/30 * * * *", New_York, utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7, 15), 20, &["01 01:00-04:00", "01 01:30-04:00", "01 02:00-05:00"]),
            // 01:00 CET, then 03:00 CEST one real hour later, 04:00 CEST.
            ("0 * * * *", Berlin, utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 2, 30), 10, &["29 01:00+01:00", "29 03:00+02:00", "29 04:00+02:00"]),
        ];
        for (cron, tz, from, to, most, want) in cases {
            let s = schedule(cron, tz);
            let got = between(&s, from, to, most);
            assert_eq!(local(&s, &got), want, "\"{cron}\" in {tz}");
        }
    }

    #[test]
    fn occurrences_are_bounded_and_exclusive_of_the_start() {
        let s = schedule("* * * * * *", Tz::UTC);
        let start = utc(2026, 1, 1, 0, 0);
        let got = between(&s, start, start + 10_000, 5);
        assert_eq!(
            got,
            vec![
                start + 1000,
                start + 2000,
                start + 3000,
                start + 4000,
                start + 5000
            ]
        );
        assert_eq!(latest_at_or_before(&s, start + 1500), Some(start + 1000));
    }
}
