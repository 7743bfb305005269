//! `GET /v1/groups` on both backends: one statement, one row per group with
//! its limits and three figures read from the claim indexes (docs/groups.md:
//! the depth costs one index entry per active receipt of the group).

use sqlx::FromRow;

use super::StoreResult;
use super::rows::to_u64;
use super::rules::{lapsed_sql, priority_below_sql, top_priority_sql, unleased_sql};
use super::views::GroupView;

/// The statement with its parameters: now (ms), page size, list names after
/// this one. A macro, so that each backend gets its own placeholders. A
/// group's oldest due time is the earliest of each priority's first entry
/// in the claim index `(group, priority, due)`, found one priority at a time
/// (as a claim finds them): a minimum over the whole due range would read
/// every due entry of the group (docs/perf-log/groups-and-status.md). The leases
/// are read once for the page, not once per group: `receipts_leases` is
/// ordered by deadline, so a group's leases are not a range of it, and each
/// group's count read every live lease. A lease implies an active row (a
/// CHECK), so the status is not named: on SQLite these reads stay in the
/// index (migrations/sqlite/0016_leases_cover_groups.sql).
macro_rules! list_groups {
    ($now:literal, $limit:literal, $cmp:literal, $after:literal, $depth:expr) => {
        concat!(
            "WITH page AS MATERIALIZED (SELECT * FROM receipt_groups WHERE name ",
            $cmp,
            " ",
            $after,
            " ORDER BY name LIMIT ",
            $limit,
            "), leased AS MATERIALIZED (SELECT receipt_group, COUNT(*) AS n FROM receipts \
               WHERE lease_until_ms > ",
            $now,
            " AND held_at_ms IS NULL GROUP BY receipt_group), \
             lapsed AS MATERIALIZED (SELECT receipt_group, MIN(next_visible_at_ms) AS m \
               FROM receipts WHERE ",
            lapsed_sql!($now),
            " AND next_visible_at_ms <= ",
            $now,
            " GROUP BY receipt_group) \
             SELECT g.name, g.paused, g.max_leased, g.rate_per_s, g.burst, ",
            $depth,
            " AS depth, COALESCE(leased.n, 0) AS leased, \
             (SELECT MIN(m) FROM (SELECT (SELECT next_visible_at_ms FROM receipts \
                WHERE receipt_group = g.name AND priority = lv.p AND ",
            unleased_sql!(),
            " ORDER BY next_visible_at_ms LIMIT 1) AS m FROM (WITH RECURSIVE lv (p) AS (SELECT ",
            top_priority_sql!("receipts", "g.name"),
            " UNION ALL SELECT ",
            priority_below_sql!("receipts", "g.name", "lv.p"),
            " FROM lv WHERE lv.p IS NOT NULL) SELECT p FROM lv WHERE p IS NOT NULL) AS lv \
              UNION ALL SELECT lapsed.m) AS due WHERE m <= ",
            $now,
            ") AS oldest_due FROM page AS g \
             LEFT JOIN leased ON leased.receipt_group = g.name \
             LEFT JOIN lapsed ON lapsed.receipt_group = g.name ORDER BY g.name"
        )
    };
}

/// Each group's depth: one index entry per active receipt of the group,
/// those holding no lease in the claim index and the leased ones in
/// `receipts_leases` (both backends keep leased rows out of their claim
/// index, so the oldest due is read from both too; a lease implies an active
/// row).
macro_rules! depth {
    () => {
        concat!(
            "((SELECT COUNT(*) FROM receipts WHERE receipt_group = g.name AND ",
            unleased_sql!(),
            ") + (SELECT COUNT(*) FROM receipts WHERE lease_until_ms IS NOT NULL \
             AND receipt_group = g.name AND held_at_ms IS NULL))"
        )
    };
}

/// The statements of each backend, by [`GroupQuery`] shape: (page, one) ×
/// (with depth, without).
pub const PG: [[&str; 2]; 2] = [
    [
        list_groups!("$1", "$2", ">", "$3", depth!()),
        list_groups!("$1", "$2", ">", "$3", "NULL"),
    ],
    [
        list_groups!("$1", "$2", "=", "$3", depth!()),
        list_groups!("$1", "$2", "=", "$3", "NULL"),
    ],
];
/// SQLite's.
pub const SQLITE: [[&str; 2]; 2] = [
    [
        list_groups!("?1", "?2", ">", "?3", depth!()),
        list_groups!("?1", "?2", ">", "?3", "NULL"),
    ],
    [
        list_groups!("?1", "?2", "=", "?3", depth!()),
        list_groups!("?1", "?2", "=", "?3", "NULL"),
    ],
];

/// Which groups to list, and whether with their depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupQuery {
    /// Most groups listed.
    pub limit: usize,
    /// List the groups named after this one (`""`: from the start) or,
    /// with `exact`, only the group of this name.
    pub after: String,
    pub exact: bool,
    /// Count each group's depth (costs one index entry per active receipt).
    pub depth: bool,
}

/// Groups shown in `/v1/status` and `/metrics`: the first this many by name
/// (a bound on the metrics' label count).
pub const GLANCE_GROUPS: usize = 100;

impl GroupQuery {
    /// The groups of `/v1/status` and `/metrics`: the first
    /// [`GLANCE_GROUPS`], without their depth (status stays cheap however
    /// many receipts are stored).
    #[must_use]
    pub fn at_a_glance() -> Self {
        Self {
            limit: GLANCE_GROUPS,
            after: String::new(),
            exact: false,
            depth: false,
        }
    }

    /// The statement of `texts` (one of [`PG`], [`SQLITE`]) for this query.
    #[must_use]
    pub fn text(&self, texts: &[[&'static str; 2]; 2]) -> &'static str {
        texts[usize::from(self.exact)][usize::from(!self.depth)]
    }
}

/// One row of the list.
#[derive(Debug, FromRow)]
pub struct GroupListRow {
    pub name: String,
    pub paused: bool,
    pub max_leased: Option<i64>,
    pub rate_per_s: Option<f64>,
    pub burst: Option<i64>,
    pub depth: Option<i64>,
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
            depth: self.depth.map(|d| to_u64(d, "group depth")).transpose()?,
            leased: to_u64(self.leased, "group leased")?,
            oldest_due_age_ms: self
                .oldest_due
                .map_or(0, |due| u64::try_from(now.saturating_sub(due)).unwrap_or(0)),
        })
    }
}
