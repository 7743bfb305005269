//! Points in time, as the store is handed them.

use std::fmt;
use std::ops::{Add, Sub};

use super::{OutOfRange, U63};

/// A point in time: milliseconds since the Unix epoch, 0..=`i64::MAX` (what
/// SQLite and PostgreSQL store exactly). Every clock reading and deadline
/// the store is handed is of this type, so no backend converts or checks a
/// time of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMs(U63);

impl UnixMs {
    /// The latest time a database can hold.
    pub const MAX: Self = Self(U63::MAX);

    /// A clock reading: one past `i64::MAX` ms (292 million years from the
    /// epoch) is that bound.
    #[must_use]
    pub fn saturating(ms: u64) -> Self {
        Self::try_from(ms).unwrap_or(Self::MAX)
    }

    /// Milliseconds since the epoch.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The value as a database integer (always fits).
    #[must_use]
    pub const fn as_i64(self) -> i64 {
        self.0.as_i64()
    }

    /// `self + ms`, or `None` past [`UnixMs::MAX`].
    #[must_use]
    pub fn checked_add(self, ms: u64) -> Option<Self> {
        self.0.checked_add(ms).map(Self)
    }
}

impl TryFrom<u64> for UnixMs {
    type Error = OutOfRange;
    fn try_from(ms: u64) -> Result<Self, OutOfRange> {
        U63::try_from(ms).map(Self)
    }
}

impl TryFrom<i64> for UnixMs {
    type Error = OutOfRange;
    fn try_from(ms: i64) -> Result<Self, OutOfRange> {
        U63::try_from(ms).map(Self)
    }
}

impl From<U63> for UnixMs {
    fn from(ms: U63) -> Self {
        Self(ms)
    }
}

impl From<UnixMs> for U63 {
    fn from(ms: UnixMs) -> Self {
        ms.0
    }
}

/// Later by `ms`, at most [`UnixMs::MAX`].
impl Add<u64> for UnixMs {
    type Output = Self;
    fn add(self, ms: u64) -> Self {
        self.checked_add(ms).unwrap_or(Self::MAX)
    }
}

/// Earlier by `ms`, at least the epoch.
impl Sub<u64> for UnixMs {
    type Output = Self;
    fn sub(self, ms: u64) -> Self {
        Self(U63::try_from(self.get().saturating_sub(ms)).unwrap_or_default())
    }
}

impl PartialEq<u64> for UnixMs {
    fn eq(&self, other: &u64) -> bool {
        self.get() == *other
    }
}

impl fmt::Display for UnixMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_stay_within_what_a_database_holds() {
        assert_eq!(UnixMs::saturating(u64::MAX), UnixMs::MAX);
        assert_eq!(UnixMs::MAX.as_i64(), i64::MAX);
        assert!(UnixMs::try_from(u64::MAX).is_err());
        assert!(UnixMs::try_from(-1_i64).is_err());
        assert_eq!(UnixMs::MAX + 1, UnixMs::MAX);
        assert_eq!(UnixMs::saturating(5) - 9, 0);
        assert_eq!(UnixMs::saturating(5) + 9, 14);
        assert_eq!(UnixMs::MAX.checked_add(1), None);
    }
}
