//! Members as listing scripts return them: whole when short, else their
//! first [`Glimpse::BYTES`] bytes with their length and SHA-1 (prelude.lua's
//! `push_glimpse`), so no page of a business in body mode carries whole
//! bodies, and a cursor or a handle can still name the member exactly.

use super::{bytes_of, int_of, StoreError};

/// A member, or the start of one with what names it exactly.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Glimpse {
    /// The member, or its first [`Glimpse::BYTES`] bytes.
    pub head: Vec<u8>,
    /// The member's length in bytes.
    pub size: usize,
    /// Its SHA-1 in hex when `head` is only its start.
    pub digest: Option<String>,
}

impl Glimpse {
    /// The most of a member a script returns (prelude.lua's `GLIMPSE`).
    pub const BYTES: usize = 4096;

    /// A member known whole.
    pub fn whole(member: Vec<u8>) -> Self {
        Self {
            size: member.len(),
            head: member,
            digest: None,
        }
    }

    /// The three values a script pushed for one member.
    pub(crate) fn read(
        it: &mut impl Iterator<Item = redis::Value>,
    ) -> Result<Option<Self>, StoreError> {
        let Some(head) = it.next() else {
            return Ok(None);
        };
        let (Some(size), Some(digest)) = (it.next(), it.next()) else {
            return Err(StoreError::Reply("a member's glimpse is cut short".into()));
        };
        let head = bytes_of(&head)?;
        let digest = String::from_utf8_lossy(&bytes_of(&digest)?).into_owned();
        if digest.is_empty() {
            return Ok(Some(Self::whole(head)));
        }
        Ok(Some(Self {
            head,
            size: int_of(Some(size))? as usize,
            digest: Some(digest),
        }))
    }

    /// The member for a terminal: printable bytes as they are, others as
    /// `\xNN`, and when only its start left Redis, its full size after.
    pub fn escaped(&self) -> String {
        let shown = crate::text::escape_bytes(&self.head);
        match self.digest {
            None => shown,
            Some(_) => format!("{shown}… ({} bytes in all)", self.size),
        }
    }

    /// The tail of prelude.lua's `step_reply`: the last member read and
    /// its score, when there was one.
    pub(crate) fn read_last(
        it: &mut impl Iterator<Item = redis::Value>,
    ) -> Result<Option<(String, Self)>, StoreError> {
        match Self::read(it)? {
            Some(g) => Ok(Some((super::score_text(it.next())?, g))),
            None => Ok(None),
        }
    }

    /// The digest as scripts take it: '' when `head` is the whole member.
    pub fn digest_arg(&self) -> &str {
        self.digest.as_deref().unwrap_or("")
    }
}
