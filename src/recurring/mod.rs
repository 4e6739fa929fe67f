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
