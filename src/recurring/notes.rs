//! The notes an operator's hand and the writer leave in `{K}:schedules`
//! beside the schedules' own state: fields no schedule name can take
//! (names never hold `@`), so one `HGETALL` reads them all.

/// The field of `{K}:schedules` set while `schedule` is paused:
/// `"<since ms> <by>"`.
pub fn paused_field(schedule: &str) -> String {
    format!("@paused:{schedule}")
}

/// The field counting the occurrences `schedule` missed, on any instance.
pub fn missed_field(schedule: &str) -> String {
    format!("@missed:{schedule}")
}

/// The field holding the due ms of the latest occurrence written.
pub fn last_field(schedule: &str) -> String {
    format!("@last:{schedule}")
}

/// Whether a field of `{K}:schedules` is one of these notes rather than a
/// schedule's state.
pub fn is_note(field: &str) -> bool {
    field.starts_with('@')
}
