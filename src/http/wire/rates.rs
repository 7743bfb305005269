//! The counts of one minute of `GET /v1/stats`, as the API shows them.

use serde::Serialize;
use utoipa::ToSchema;

use crate::store;

/// What happened in one minute, summed over every server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct StatsCounts {
    /// Receipts stored for the first time (an identical receipt sent again is not counted).
    pub enqueued: u64,
    /// Outcomes `accepted` committed: receipts settled.
    pub settled: u64,
    /// Outcomes `skipped` committed.
    pub skipped: u64,
    /// Failures committed that were scheduled for another attempt.
    pub retried: u64,
    /// Failures committed that dead-lettered their receipt (permanent, or out of retries).
    pub dead_lettered: u64,
    /// Writes refused as conflicts (stale, forged or late claims), as `settled_conflicts_total`.
    pub conflicts: u64,
}

impl From<store::StatsCounts> for StatsCounts {
    fn from(counts: store::StatsCounts) -> Self {
        // Every field named: a counter added to the store's list fails to
        // compile here until the API shows it.
        let store::StatsCounts {
            enqueued,
            settled,
            skipped,
            retried,
            dead_lettered,
            conflicts,
        } = counts;
        Self {
            enqueued,
            settled,
            skipped,
            retried,
            dead_lettered,
            conflicts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StatsCounts;
    use crate::store;

    #[test]
    fn the_api_shows_each_counter_under_its_column_name() {
        let counts = store::StatsCounts::from_values(&[1, 2, 3, 4, 5, 6]);
        let json = serde_json::to_value(StatsCounts::from(counts)).unwrap();
        assert_eq!(
            json.as_object().map(serde_json::Map::len),
            Some(store::StatsCounts::COLUMNS.len())
        );
        for (column, value) in store::StatsCounts::COLUMNS.iter().zip(counts.values()) {
            assert_eq!(json[column], value, "{column}");
        }
    }
}
