//! `GET /v1/groups` on both backends: one statement, one row per group with
//! its limits and three figures read from the claim indexes (docs/groups.md:
//! the depth costs one index entry per active receipt of the group).

use sqlx::FromRow;

use super::StoreResult;
use super::rows::to_u64;
use super::views::GroupView;

/// The statement with its parameters: now (ms), page size, list names after
/// this one. A macro, so that each backend gets its own placeholders.
macro_rules! list_groups {
    ($now:literal, $limit:literal, $cmp:literal, $after:literal) => {
        concat!(
            "SELECT g.name, g.paused, g.max_leased, g.rate_per_s, g.burst, \
             (SELECT COUNT(*) FROM receipts WHERE receipt_group = g.name AND status = 'active' \
                AND held_at_ms IS NULL) AS depth, \
             (SELECT COUNT(*) FROM receipts WHERE receipt_group = g.name AND status = 'active' \
                AND held_at_ms IS NULL AND lease_until_ms > ",
            $now,
            ") AS leased, \
             (SELECT MIN(next_visible_at_ms) FROM receipts WHERE receipt_group = g.name \
                AND status = 'active' AND held_at_ms IS NULL AND next_visible_at_ms <= ",
            $now,
            " AND (lease_until_ms IS NULL OR lease_until_ms <= ",
            $now,
            ")) AS oldest_due FROM receipt_groups g WHERE g.name ",
            $cmp,
            " ",
            $after,
            " ORDER BY g.name LIMIT ",
            $limit
        )
    };
}

/// PostgreSQL's text: a page.
pub const LIST_GROUPS_PG: &str = list_groups!("$1", "$2", ">", "$3");
/// SQLite's text: a page.
pub const LIST_GROUPS_SQLITE: &str = list_groups!("?1", "?2", ">", "?3");
/// PostgreSQL's text: one group.
pub const ONE_GROUP_PG: &str = list_groups!("$1", "$2", "=", "$3");
/// SQLite's text: one group.
pub const ONE_GROUP_SQLITE: &str = list_groups!("?1", "?2", "=", "?3");

/// One row of the list.
#[derive(Debug, FromRow)]
pub struct GroupListRow {
    pub name: String,
    pub paused: bool,
    pub max_leased: Option<i64>,
    pub rate_per_s: Option<f64>,
    pub burst: Option<i64>,
    pub depth: i64,
    pub leased: i64,
    pub oldest_due: Option<i64>,
}

impl GroupListRow {
    /// The listed view at `now`.
    pub fn view(self, now: i64) -> StoreResult<GroupView> {
        let limits =
            super::fair::limits(self.paused, self.max_leased, self.rate_per_s, self.burst)?;
        Ok(GroupView {
            group: self.name,
            paused: limits.paused,
            max_leased: limits.max_leased,
            rate: limits.rate,
            depth: to_u64(self.depth, "group depth")?,
            leased: to_u64(self.leased, "group leased")?,
            oldest_due_age_ms: self
                .oldest_due
                .map_or(0, |due| u64::try_from(now.saturating_sub(due)).unwrap_or(0)),
        })
    }
}
