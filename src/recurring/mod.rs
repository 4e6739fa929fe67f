//! Recurring schedules: cron expressions in a time zone, each occurrence
//! delivered exactly once whatever the number of instances.
//!
//! An occurrence is a deterministic id-mode member, `SCHEDULE@<epoch ms>`,
//! written ahead by whichever instance's pass comes first (see [`writer`]),
//! and delivered by the scanners like any task. Its `message_id` is stable,
//! so a consumer can de-duplicate the one duplicate a crash can cause.
//!
//! - [`occurrences`]: when they fall, with the daylight-saving rules;
//! - [`writer`]: the task that writes them (`src/lua/recurring.lua`);
//! - [`control`]: pause, resume and run one now (`src/lua/schedule_pause.lua`);
//! - [`view`]: each schedule's state as the console and CLI show it.

pub mod control;
pub mod notes;
pub mod occurrences;
pub mod view;
pub mod writer;

use crate::config::recurring_section::Schedule;
use crate::config::Business;

/// The one-line refusal for a business without recurring schedules; `None`
/// when `b` has some.
pub fn none_in(b: &Business) -> Option<String> {
    b.recurring.is_empty().then(|| {
        format!(
            "business \"{}\" has no recurring schedules ([businesses.{}.recurring.NAME])",
            b.name, b.name
        )
    })
}

/// The schedule of `b` called `name`, or why not in one line: naming the
/// schedules it has, or saying it has none.
pub fn named<'a>(b: &'a Business, name: &str) -> Result<&'a Schedule, String> {
    b.recurring.iter().find(|s| s.name == name).ok_or_else(|| {
        none_in(b).unwrap_or_else(|| {
            let known: Vec<&str> = b.recurring.iter().map(|s| s.name.as_str()).collect();
            format!(
                "business \"{}\" has no schedule \"{name}\": its schedules are {}",
                b.name,
                known.join(", ")
            )
        })
    })
}
