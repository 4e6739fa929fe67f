//! Progress of commands that may run for minutes (`bulk`, `adopt`,
//! `bench`): a line on stderr with the count, the rate and, where the total
//! is known, the time left. Drawn only when both stdout and stderr are
//! terminals, so a script, a pipe or a log file gets exactly the output it
//! got before.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One long step's progress; hidden (every call a no-op) off a terminal.
pub struct Progress(ProgressBar);

impl Progress {
    /// A progress line for `what`, towards `total` when it is known.
    pub fn new(what: &str, total: Option<u64>) -> Self {
        let bar = match total {
            Some(n) => ProgressBar::with_draw_target(Some(n), target()).with_style(counted()),
            None => ProgressBar::with_draw_target(None, target()).with_style(open()),
        };
        bar.set_message(what.to_string());
        if !bar.is_hidden() {
            // The rate and time left move even while one step is slow.
            bar.enable_steady_tick(Duration::from_millis(250));
        }
        Progress(bar)
    }

    /// Counts `n` more done.
    pub fn add(&self, n: u64) {
        self.0.inc(n);
    }

    /// Sets how many are done, for work counted from outside.
    pub fn set(&self, done: u64) {
        self.0.set_position(done);
    }

    /// Leaves the final count on the terminal.
    pub fn finish(self) {
        self.0.finish();
    }

    /// Removes the line, for a step whose result is printed after it.
    pub fn clear(self) {
        self.0.finish_and_clear();
    }
}

/// stderr when stdout and stderr are both terminals, else nothing at all.
fn target() -> ProgressDrawTarget {
    if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

fn counted() -> ProgressStyle {
    ProgressStyle::with_template("{msg}: {human_pos}/{human_len} [{bar:30}] {per_sec}, {eta} left")
        .expect("a valid template")
        .progress_chars("=> ")
}

fn open() -> ProgressStyle {
    ProgressStyle::with_template("{msg}: {human_pos} {per_sec}, {elapsed} so far")
        .expect("a valid template")
}
