//! Checks that more than one section uses.

use super::*;

/// Parses a duration setting at `place` (e.g. `business "b", field "lease"`):
/// longer than zero and at most `max`, else a problem and `None`.
pub(crate) fn parse_duration(
    place: &str,
    s: &str,
    max: Duration,
    problems: &mut Vec<String>,
) -> Option<Duration> {
    match humantime::parse_duration(s.trim()) {
        Ok(d) if d.is_zero() => {
            problems.push(format!("{place} must be longer than zero (got \"{s}\")"));
            None
        }
        Ok(d) if d > max => {
            problems.push(format!(
                "{place} must be at most {} (got \"{s}\")",
                humantime::format_duration(max)
            ));
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(format!(
                "{place}: cannot parse \"{s}\" as a duration ({e}); write e.g. \"250ms\", \"30s\" or \"5m\""
            ));
            None
        }
    }
}

/// A problem if `value` is longer than an AMQP short string can carry.
pub(crate) fn check_short_string(place: &str, value: &str, problems: &mut Vec<String>) {
    if value.len() > limits::SHORT_STRING {
        problems.push(format!(
            "{place} must be at most {} bytes (got {}): AMQP carries it as a short string",
            limits::SHORT_STRING,
            value.len()
        ));
    }
}

/// A required text setting at `place`: missing is a problem, and so is
/// empty unless `empty_ok`; both give "".
pub(crate) fn required(
    place: &str,
    value: Option<String>,
    empty_ok: bool,
    problems: &mut Vec<String>,
) -> String {
    match value {
        Some(s) if empty_ok || !s.is_empty() => s,
        Some(_) => {
            problems.push(format!("{place} must not be empty"));
            String::new()
        }
        None => {
            problems.push(format!("{place} is required"));
            String::new()
        }
    }
}

/// A count setting at `place`: unset means `default`, else it must be from
/// 1 to `max`; anything else is a problem and `default`.
pub(crate) fn size_within(
    place: &str,
    value: Option<i64>,
    default: i64,
    max: i64,
    problems: &mut Vec<String>,
) -> i64 {
    match value {
        None => default,
        Some(n) if n < 1 => {
            problems.push(format!("{place} must be at least 1 (got {n})"));
            default
        }
        Some(n) if n > max => {
            problems.push(format!("{place} must be at most {max} (got {n})"));
            default
        }
        Some(n) => n,
    }
}

/// The value of a setting that takes one of a few words: `choices` lists
/// each word, a note shown beside it in the problem (or ""), and its value;
/// unset means the first. Anything else is a problem naming every word, and
/// the first value.
pub(crate) fn one_of<T: Copy>(
    place: &str,
    value: Option<&str>,
    choices: &[(&str, &str, T)],
    problems: &mut Vec<String>,
) -> T {
    let Some(value) = value else {
        return choices[0].2;
    };
    if let Some((_, _, v)) = choices.iter().find(|(word, _, _)| *word == value) {
        return *v;
    }
    let words: Vec<String> = choices
        .iter()
        .map(|(word, note, _)| match note.is_empty() {
            true => format!("\"{word}\""),
            false => format!("\"{word}\" ({note})"),
        })
        .collect();
    let (last, rest) = words.split_last().expect("at least one choice");
    let list = match rest.is_empty() {
        true => last.clone(),
        false => format!("{} or {last}", rest.join(", ")),
    };
    problems.push(format!("{place} must be {list} (got \"{value}\")"));
    choices[0].2
}

#[cfg(test)]
mod tests {
    use super::one_of;

    #[test]
    fn one_of_takes_a_listed_word_or_names_every_word() {
        let choices = [("a", "", 1), ("b", "the second", 2), ("c", "", 3)];
        let mut problems = Vec::new();
        assert_eq!(one_of("field \"f\"", None, &choices, &mut problems), 1);
        assert_eq!(one_of("field \"f\"", Some("c"), &choices, &mut problems), 3);
        assert!(problems.is_empty());
        assert_eq!(one_of("field \"f\"", Some("d"), &choices, &mut problems), 1);
        assert_eq!(
            problems,
            [r#"field "f" must be "a", "b" (the second) or "c" (got "d")"#]
        );
    }
}
