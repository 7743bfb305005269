//! One entry of the history feed (`GET /v1/history`) as the API shows it.

use serde::Serialize;
use utoipa::ToSchema;

use super::history_entry::HistoryEntry;
use crate::store;

/// One feed entry: a history entry, its receipt and its position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FeedEntry {
    /// This entry's position: pass it as `after` (or `Last-Event-ID`) to
    /// continue after it.
    pub cursor: String,
    pub receipt_id: String,
    #[serde(flatten)]
    pub entry: HistoryEntry,
}

impl From<store::FeedEntry> for FeedEntry {
    fn from(entry: store::FeedEntry) -> Self {
        let store::FeedEntry {
            cursor,
            receipt_id,
            entry,
        } = entry;
        Self {
            cursor,
            receipt_id,
            entry: entry.into(),
        }
    }
}
