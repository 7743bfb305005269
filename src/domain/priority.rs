//! Priorities (docs/groups.md, "Priorities"): within a group a claim takes
//! the highest priority first, then the oldest due. Groups are shared out
//! as before: a priority never lets one group take another's turn.

use std::fmt;

/// Lowest priority a producer may give.
pub const MIN_PRIORITY: i64 = -1000;
/// Highest priority a producer may give.
pub const MAX_PRIORITY: i64 = 1000;

/// A receipt's priority: `MIN_PRIORITY..=MAX_PRIORITY`, default 0, higher
/// first. Small on purpose: a claim visits each priority in use in a
/// group once, so a narrow range keeps that short and the stored column
/// small.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(i16);

/// A priority outside `MIN_PRIORITY..=MAX_PRIORITY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("priority must be an integer from -1000 to 1000")]
pub struct PriorityError;

impl Priority {
    /// A priority from a request or a stored row.
    pub fn parse(value: i64) -> Result<Self, PriorityError> {
        match i16::try_from(value) {
            Ok(v) if (MIN_PRIORITY..=MAX_PRIORITY).contains(&value) => Ok(Self(v)),
            _ => Err(PriorityError),
        }
    }

    #[must_use]
    pub fn get(self) -> i64 {
        i64::from(self.0)
    }

    /// As the `priority` column holds it (`SMALLINT` on PostgreSQL).
    #[must_use]
    pub fn stored(self) -> i16 {
        self.0
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_bounded() {
        assert_eq!(Priority::default().get(), 0);
        assert_eq!(Priority::parse(1000).map(Priority::get), Ok(1000));
        assert_eq!(Priority::parse(-1000).map(Priority::get), Ok(-1000));
        assert_eq!(Priority::parse(1001), Err(PriorityError));
        assert_eq!(Priority::parse(-1001), Err(PriorityError));
        assert_eq!(Priority::parse(i64::MIN), Err(PriorityError));
    }
}
