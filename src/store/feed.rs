//! The history feed: every `receipt_history` entry in commit order, read
//! page by page from a position (docs/operators.md, "Follow every outcome").
//!
//! A position is `(tx, id)`: on PostgreSQL the id of the transaction that
//! wrote the entry and the entry's id; on SQLite (one writer, so id order is
//! commit order) `tx` is always 0. Entries come in `(tx, id)` order and a
//! position, once served, never has an entry appear before it.

use std::fmt;
use std::str::FromStr;

use super::rows::{HistoryRow, to_u64};
use super::{HistoryEntry, StoreResult};

/// A place in the feed: after the entry `(tx, id)`. `(0, 0)` is before everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeedPosition {
    pub tx: u64,
    pub id: u64,
}

impl FeedPosition {
    /// Before every entry.
    pub const START: Self = Self { tx: 0, id: 0 };
}

/// Written as `TX-ID` (decimal), e.g. `0-42` on SQLite or `7351-42` on PostgreSQL.
impl fmt::Display for FeedPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.tx, self.id)
    }
}

/// A text that is not `TX-ID` with both parts decimal, at most `i64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFeedPosition;

impl FromStr for FeedPosition {
    type Err = BadFeedPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (tx, id) = text.split_once('-').ok_or(BadFeedPosition)?;
        let part = |s: &str| -> Result<u64, BadFeedPosition> {
            // Digits only: no sign, no spaces, no `+`.
            if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BadFeedPosition);
            }
            let n: u64 = s.parse().map_err(|_| BadFeedPosition)?;
            i64::try_from(n).map_err(|_| BadFeedPosition)?;
            Ok(n)
        };
        Ok(Self {
            tx: part(tx)?,
            id: part(id)?,
        })
    }
}

/// Where a feed read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedStart {
    /// The oldest entry still retained (just after the purge horizon).
    Beginning,
    /// Just after this position, as a previous read returned it.
    After(FeedPosition),
    /// The newest entry committed now: only what comes later.
    Latest,
    /// The newest entries up to and including this position (`before`):
    /// the ones `After` of the same position does not return.
    UpTo(FeedPosition),
    /// The newest entries up to and including the tip (`before=latest`).
    UpToLatest,
}

/// One feed entry: a history entry, its receipt and its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedEntry {
    /// This entry's position: pass it as `after` (or `Last-Event-ID`) to
    /// continue after it.
    pub cursor: String,
    pub receipt_id: String,
    pub entry: HistoryEntry,
}

/// What a feed read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedRead {
    /// Entries after the start, oldest first, and where to continue: the last
    /// entry's position, or the start's when there is none.
    Page {
        entries: Vec<FeedEntry>,
        next: FeedPosition,
    },
    /// Retention deleted entries after this start before they were read: the
    /// feed cannot continue from it without a gap. `horizon` is the highest
    /// position deleted; reading again from the beginning starts after it.
    Expired { horizon: FeedPosition },
    /// The position is past everything this store ever wrote: it did not
    /// come from this store.
    Ahead { tip: FeedPosition },
}

/// One feed row as both backends read it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FeedRow {
    pub tx: i64,
    pub entry_id: i64,
    pub receipt_id: String,
    #[sqlx(flatten)]
    pub history: HistoryRow,
}

impl FeedRow {
    /// The row's position.
    pub fn position(&self) -> StoreResult<FeedPosition> {
        Ok(FeedPosition {
            tx: to_u64(self.tx, "history tx")?,
            id: to_u64(self.entry_id, "history id")?,
        })
    }

    /// The feed entry.
    pub fn entry(self) -> StoreResult<FeedEntry> {
        let position = self.position()?;
        Ok(FeedEntry {
            cursor: position.to_string(),
            receipt_id: self.receipt_id,
            entry: self.history.entry()?,
        })
    }
}

/// The columns of a [`FeedRow`] after `tx` (each backend selects `tx` its own
/// way): the entry's position and receipt, then those of a [`HistoryRow`].
pub const FEED_COLUMNS: &str = concat!(
    "id AS entry_id, receipt_id, ",
    crate::store::rows::history_columns!()
);

/// How a backend reads the feed, all in one snapshot.
pub(crate) trait FeedSource {
    /// The highest position retention deleted ([`FeedPosition::START`] if none).
    async fn horizon(&mut self) -> StoreResult<FeedPosition>;
    /// The newest position the feed may serve now ([`FeedPosition::START`] if none).
    async fn tip(&mut self) -> StoreResult<FeedPosition>;
    /// Up to `limit` rows after `after`, in feed order.
    async fn rows(&mut self, after: FeedPosition, limit: usize) -> StoreResult<Vec<FeedRow>>;
    /// The last `limit` rows after `after` and up to `upto` included, newest first.
    async fn rows_back(
        &mut self,
        after: FeedPosition,
        upto: FeedPosition,
        limit: usize,
    ) -> StoreResult<Vec<FeedRow>>;
}

/// The newest `limit` entries up to `upto` (`None`: the tip) and it, oldest first; the page's
/// `next` is `upto`, so that reading on after it leaves no gap.
async fn read_back(
    source: &mut impl FeedSource,
    horizon: FeedPosition,
    upto: Option<FeedPosition>,
    limit: usize,
) -> StoreResult<FeedRead> {
    let tip = source.tip().await?.max(horizon);
    let upto = upto.unwrap_or(tip);
    if upto > tip {
        return Ok(FeedRead::Ahead { tip });
    }
    if upto < horizon {
        return Ok(FeedRead::Expired { horizon });
    }
    let mut rows = source.rows_back(horizon, upto, limit).await?;
    rows.reverse();
    let entries = rows
        .into_iter()
        .map(FeedRow::entry)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(FeedRead::Page {
        entries,
        next: upto,
    })
}

/// One feed read, the same on every backend.
pub(crate) async fn read(
    source: &mut impl FeedSource,
    start: FeedStart,
    limit: usize,
) -> StoreResult<FeedRead> {
    let horizon = source.horizon().await?;
    let after = match start {
        FeedStart::Beginning => horizon,
        FeedStart::After(position) if position < horizon => {
            return Ok(FeedRead::Expired { horizon });
        }
        FeedStart::After(position) => position,
        FeedStart::Latest => source.tip().await?.max(horizon),
        FeedStart::UpTo(position) => {
            return read_back(source, horizon, Some(position), limit).await;
        }
        FeedStart::UpToLatest => return read_back(source, horizon, None, limit).await,
    };
    let rows = source.rows(after, limit).await?;
    let Some(last) = rows.last() else {
        if matches!(start, FeedStart::After(_)) {
            // Retention never lowers the tip below the horizon, so a
            // position past both was never served by this store.
            let tip = source.tip().await?.max(horizon);
            if after > tip {
                return Ok(FeedRead::Ahead { tip });
            }
        }
        return Ok(FeedRead::Page {
            entries: Vec::new(),
            next: after,
        });
    };
    let next = last.position()?;
    let entries = rows
        .into_iter()
        .map(FeedRow::entry)
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(FeedRead::Page { entries, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_refuse_anything_else() {
        let p = FeedPosition { tx: 7351, id: 42 };
        assert_eq!(p.to_string(), "7351-42");
        assert_eq!("7351-42".parse(), Ok(p));
        assert_eq!("0-0".parse(), Ok(FeedPosition::START));
        for bad in [
            "",
            "-",
            "1",
            "1-",
            "-1",
            "1--1",
            "+1-2",
            "1-2-3",
            " 1-2",
            "1-9223372036854775808",
            "a-1",
        ] {
            assert_eq!(bad.parse::<FeedPosition>(), Err(BadFeedPosition), "{bad:?}");
        }
        assert!(FeedPosition { tx: 1, id: 0 } > FeedPosition { tx: 0, id: 99 });
    }
}
