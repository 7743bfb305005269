//! The `status` column of a receipt row: whether its work is still moving
//! (`active`: pending, scheduled, leased or waiting for a retry) or how it
//! finished. What a reader is told is [`super::ReceiptState`], derived from
//! this and the lease.

use thiserror::Error;

/// Where a receipt's row stands, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    Settled,
    Skipped,
    DeadLettered,
    Canceled,
}

/// A stored status this release does not know.
#[derive(Debug, Error)]
#[error("stored status {0:?} is unknown")]
pub struct UnknownStatus(String);

impl Status {
    /// The stored text (the `CHECK` of both backends' migrations).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Settled => "settled",
            Self::Skipped => "skipped",
            Self::DeadLettered => "dead_lettered",
            Self::Canceled => "canceled",
        }
    }
}

impl TryFrom<String> for Status {
    type Error = UnknownStatus;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Ok(match text.as_str() {
            "active" => Self::Active,
            "settled" => Self::Settled,
            "skipped" => Self::Skipped,
            "dead_lettered" => Self::DeadLettered,
            "canceled" => Self::Canceled,
            _ => return Err(UnknownStatus(text)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_as_written() {
        use Status::*;
        for status in [Active, Settled, Skipped, DeadLettered, Canceled] {
            assert_eq!(
                Status::try_from(status.as_str().to_owned()).unwrap(),
                status
            );
        }
        assert!(Status::try_from("bogus".to_owned()).is_err());
    }
}
