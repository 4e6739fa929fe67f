//! The validated `[businesses.NAME.recurring.SCHEDULE]` sections.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use croner::parser::{CronParser, Seconds};
use croner::Cron;
use serde::Deserialize;

/// Defaults of the optional schedule settings, shown in docs/configuration.md.
pub mod defaults {
    /// Occurrences missed while no instance ran: the latest one is delivered.
    pub const CATCH_UP: &str = "last";
    /// How far back missed occurrences are caught up.
    pub const CATCH_UP_WINDOW: &str = "1h";
    /// How far ahead occurrences are written.
    pub const WRITE_AHEAD: &str = "60s";
}

/// The longest `write_ahead`.
const MAX_WRITE_AHEAD: Duration = Duration::from_secs(86_400);

/// The longest `catch_up_window`.
const MAX_CATCH_UP_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// What happens to occurrences that came due while no instance was writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// None is delivered; each counts as missed.
    None,
    /// The latest one within the window is delivered; the others count as missed.
    Last,
    /// Every one within the window is delivered; older ones count as missed.
    All,
}

/// One recurring schedule of a business.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its name: the part of each occurrence's id before `@`.
    pub name: String,
    /// The cron expression as written.
    pub cron_text: String,
    /// The parsed expression.
    pub cron: Cron,
    /// The time zone the expression is read in.
    pub tz: chrono_tz::Tz,
    /// What each occurrence publishes.
    pub body: Vec<u8>,
    /// Its own routing key, instead of the business's.
    pub routing_key: Option<String>,
    /// The policy for occurrences missed while no instance ran.
    pub catch_up: CatchUp,
    /// How far back missed occurrences are considered.
    pub catch_up_window: Duration,
    /// How far ahead occurrences are written into Redis.
    pub write_ahead: Duration,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint() == other.fingerprint() && self.name == other.name
    }
}

impl Schedule {
    /// What identifies the schedule's occurrences: a change to any of these
    /// replaces its future occurrences. 16 hex digits.
    pub fn fingerprint(&self) -> String {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for part in [
            self.cron_text.as_bytes(),
            self.tz.name().as_bytes(),
            &self.body,
            self.routing_key.as_deref().unwrap_or("\u{0}").as_bytes(),
        ] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        format!("{:016x}", h.digest())
    }
}

/// A schedule as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSchedule {
    cron: Option<String>,
    tz: Option<String>,
    body: Option<String>,
    body_file: Option<String>,
    routing_key: Option<String>,
    catch_up: Option<String>,
    catch_up_window: Option<String>,
    write_ahead: Option<String>,
}

/// Parses a cron expression: five fields, or six with seconds first.
pub fn parse_cron(text: &str) -> Result<Cron, String> {
    let fields = text.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "\"{text}\" has {fields} fields; write five (minute hour day month weekday) or six (seconds first)"
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(text)
        .map_err(|e| format!("\"{text}\" is not a cron expression ({e})"))
}

/// Validates a business's schedules, pushing one problem per bad field.
/// `config_dir` anchors a relative `body_file`.
pub(crate) fn validate(
    business: &str,
    raw: BTreeMap<String, RawSchedule>,
    config_dir: &Path,
    problems: &mut Vec<String>,
) -> Vec<Schedule> {
    raw.into_iter()
        .filter_map(|(name, r)| schedule(business, name, r, config_dir, problems))
        .collect()
}

/// One schedule, or `None` with its problems pushed.
fn schedule(
    business: &str,
    name: String,
    r: RawSchedule,
    config_dir: &Path,
    problems: &mut Vec<String>,
) -> Option<Schedule> {
    let place =
        |field: &str| format!("business \"{business}\", schedule \"{name}\", field \"{field}\"");
    let before = problems.len();
    problems.extend(bad_name(business, &name));
    let cron = cron(&place("cron"), r.cron.as_deref(), problems);
    let tz = time_zone(&place("tz"), r.tz.as_deref(), problems);
    let body = body(business, &name, r.body, r.body_file, config_dir, problems);
    if let Some(rk) = &r.routing_key {
        crate::config::check_short_string(&place("routing_key"), rk, problems);
    }
    let catch_up = crate::config::one_of(
        &place("catch_up"),
        Some(r.catch_up.as_deref().unwrap_or(defaults::CATCH_UP)),
        &[
            ("none", "", CatchUp::None),
            ("last", "", CatchUp::Last),
            ("all", "", CatchUp::All),
        ],
        problems,
    );
    let (_, catch_up_window) = duration_field(
        &place("catch_up_window"),
        r.catch_up_window,
        (defaults::CATCH_UP_WINDOW, MAX_CATCH_UP_WINDOW),
        problems,
    );
    let (ahead_text, write_ahead) = duration_field(
        &place("write_ahead"),
        r.write_ahead,
        (defaults::WRITE_AHEAD, MAX_WRITE_AHEAD),
        problems,
    );
    if write_ahead.is_some_and(|d| d < Duration::from_secs(1)) {
        problems.push(format!(
            "{} must be at least 1s (got \"{ahead_text}\")",
            place("write_ahead")
        ));
    }
    if let Some(c) = &cron {
        problems.extend(never_matches(&place("cron"), c, tz, r.cron.as_deref()));
    }
    if problems.len() != before {
        return None;
    }
    Some(Schedule {
        name,
        cron_text: r.cron.unwrap_or_default(),
        cron: cron?,
        tz: tz?,
        body: body?,
        routing_key: r.routing_key,
        catch_up,
        catch_up_window: catch_up_window?,
        write_ahead: write_ahead?,
    })
}

/// A duration field, `default` when unset and at most `max`: its text (for
/// later messages) and its value, or `None` with the problem pushed.
fn duration_field(
    place: &str,
    v: Option<String>,
    (default, max): (&str, Duration),
    problems: &mut Vec<String>,
) -> (String, Option<Duration>) {
    let text = v.unwrap_or_else(|| default.to_string());
    let d = crate::config::parse_duration(place, &text, max, problems);
    (text, d)
}

/// A schedule's name starts each occurrence's id: 1 to 200 bytes, no `@`.
fn bad_name(business: &str, name: &str) -> Option<String> {
    (name.is_empty() || name.contains('@') || name.len() > 200).then(|| format!(
        "business \"{business}\", schedule \"{name}\": a schedule name must be 1 to 200 bytes without '@' (it starts each occurrence's id)"
    ))
}

/// `cron`: required, and a cron expression.
fn cron(place: &str, text: Option<&str>, problems: &mut Vec<String>) -> Option<Cron> {
    let Some(text) = text else {
        problems.push(format!("{place} is required"));
        return None;
    };
    parse_cron(text)
        .map_err(|e| problems.push(format!("{place}: {e}")))
        .ok()
}

/// `tz`: an IANA time zone, UTC when unset.
fn time_zone(place: &str, text: Option<&str>, problems: &mut Vec<String>) -> Option<chrono_tz::Tz> {
    let Some(t) = text else {
        return Some(chrono_tz::Tz::UTC);
    };
    chrono_tz::Tz::from_str(t)
        .map_err(|_| problems.push(format!(
            "{place}: \"{t}\" is not an IANA time zone; write e.g. \"Europe/Berlin\", \"America/New_York\" or \"UTC\""
        )))
        .ok()
}

/// `body` or `body_file` (read relative to `config_dir`), exactly one.
fn body(
    business: &str,
    name: &str,
    body: Option<String>,
    body_file: Option<String>,
    config_dir: &Path,
    problems: &mut Vec<String>,
) -> Option<Vec<u8>> {
    let schedule = format!("business \"{business}\", schedule \"{name}\"");
    match (body, body_file) {
        (Some(b), None) => Some(b.into_bytes()),
        (None, Some(f)) => {
            let path = config_dir.join(&f);
            std::fs::read(&path)
                .map_err(|e| {
                    problems.push(format!(
                        "{schedule}, field \"body_file\": cannot read {}: {e}",
                        path.display()
                    ))
                })
                .ok()
        }
        (Some(_), Some(_)) => {
            problems.push(format!("{schedule}: set body or body_file, not both"));
            None
        }
        (None, None) => {
            problems.push(format!("{schedule}: body or body_file is required"));
            None
        }
    }
}

/// A cron expression that never comes due from now on, in `tz` (UTC when
/// the zone itself is a problem).
fn never_matches(
    place: &str,
    cron: &Cron,
    tz: Option<chrono_tz::Tz>,
    text: Option<&str>,
) -> Option<String> {
    let now = chrono::Utc::now().with_timezone(&tz.unwrap_or(chrono_tz::Tz::UTC));
    cron.find_next_occurrence(&now, false)
        .is_err()
        .then(|| format!("{place}: \"{}\" never matches a date", text.unwrap_or("")))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    fn config(schedule: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(
            f,
            "[redis]\nurl = \"redis://127.0.0.1:6379/0\"\n[amqp]\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
             [businesses.reports]\nkey = \"delay:reports\"\nexchange = \"reports\"\nrouting_key = \"r\"\n\
             [businesses.reports.recurring.nightly]\n{schedule}\n"
        )
        .unwrap();
        f
    }

    #[test]
    fn a_schedule_implies_id_mode_and_the_environment_overrides_its_fields() {
        let f = config("cron = \"0 30 2 * * *\"\ntz = \"Europe/Berlin\"\nbody = \"x\"");
        let env: config::Map<String, String> = [(
            "DELAYD_BUSINESSES__REPORTS__RECURRING__NIGHTLY__CRON".to_string(),
            "0 0 3 * * *".to_string(),
        )]
        .into_iter()
        .collect();
        let c = crate::config::load_with_env(f.path(), env).unwrap();
        let b = &c.businesses[0];
        assert!(b.member.is_id());
        assert_eq!(b.recurring[0].cron_text, "0 0 3 * * *");
        assert_eq!(b.recurring[0].tz, chrono_tz::Europe::Berlin);
        assert_eq!(b.recurring[0].catch_up, super::CatchUp::Last);
    }

    #[test]
    fn a_missing_body_a_bad_catch_up_and_a_short_write_ahead_are_all_reported() {
        let f = config("cron = \"0 * * * *\"\ncatch_up = \"sometimes\"\nwrite_ahead = \"500ms\"");
        let e = crate::config::load(f.path()).unwrap_err().to_string();
        for want in [
            "schedule \"nightly\": body or body_file is required",
            "field \"catch_up\" must be \"none\", \"last\" or \"all\" (got \"sometimes\")",
            "field \"write_ahead\" must be at least 1s",
        ] {
            assert!(e.contains(want), "{want:?} missing from {e}");
        }
    }
}
