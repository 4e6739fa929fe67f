//! The `COUNT` of scan steps whose matches Redis copies into Lua (a search
//! or bulk action by prefix in body mode, a search by payload): at about
//! 8 ms per MiB on a 2-core VM, one step of 500 members of 1 MiB held
//! Redis, and every delivery, for seconds. Each step is sized from the
//! sizes the earlier ones copied, so it copies about [`STEP_BYTES`].

/// The largest `COUNT` hint of a search step: members Redis looks at per
/// call.
pub const MOST: usize = 500;

/// Bytes of matches one step aims to copy into Lua.
pub const STEP_BYTES: usize = 8 << 20;

/// How far the `COUNT` grows after a step that copied nothing, while no
/// size is known: a few steps reach [`MOST`], and a first step copies one
/// match however large.
const GROWTH: usize = 8;

/// The next step's `COUNT`, learned from the steps so far.
#[derive(Debug, Clone, Copy)]
pub struct StepSize {
    count: usize,
    /// The largest average match size a step has copied, once one has.
    each: Option<usize>,
    most: usize,
}

impl Default for StepSize {
    fn default() -> Self {
        Self::up_to(MOST)
    }
}

impl StepSize {
    /// Steps of at most `most` members.
    pub fn up_to(most: usize) -> Self {
        Self {
            count: 1,
            each: None,
            most: most.max(1),
        }
    }

    /// The `COUNT` of the next step.
    pub fn count(&self) -> usize {
        self.count
    }

    /// After a step that copied `copied` matches of `bytes` in all.
    pub fn saw(&mut self, copied: usize, bytes: usize) {
        if let Some(average) = bytes.checked_div(copied) {
            let average = average.max(1);
            self.each = Some(self.each.map_or(average, |e| e.max(average)));
        }
        self.count = match self.each {
            Some(each) => (STEP_BYTES / each).clamp(1, self.most),
            None => (self.count * GROWTH).min(self.most),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(steps: &[(usize, usize)]) -> usize {
        let mut s = StepSize::default();
        for &(copied, bytes) in steps {
            s.saw(copied, bytes);
        }
        s.count()
    }

    #[test]
    fn a_step_copies_about_8_mib_of_matches_at_the_largest_size_seen() {
        assert_eq!(StepSize::default().count(), 1, "a first step, size unknown");
        assert_eq!(after(&[(1, 60)]), MOST, "small members");
        assert_eq!(after(&[(1, 1 << 20)]), 8, "members of 1 MiB");
        assert_eq!(after(&[(1, 64 << 20)]), 1, "members of 64 MiB");
        assert_eq!(
            after(&[(1, 1 << 20), (400, 4000)]),
            8,
            "the largest size stays"
        );
        assert_eq!(after(&[(0, 0), (0, 0)]), 64, "nothing copied yet: it grows");
        assert_eq!(after(&[(0, 0), (0, 0), (0, 0), (0, 0)]), MOST);
    }
}
