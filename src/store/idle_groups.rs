//! Forgetting idle groups (docs/groups.md, "Idle groups are forgotten"): the
//! row of a group with no limits set and no active receipt (none waiting,
//! due, leased or held) carries nothing a claim or the list needs, and a
//! group per merchant would otherwise keep a row per merchant ever seen. The
//! sweep reads the group rows a page at a time, by name, and deletes the
//! idle ones; a receipt naming the group again creates its row again.

/// Group rows read per page of a sweep.
pub const PAGE: usize = 1000;

/// What one page of a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptGroups {
    /// Group rows read.
    pub looked: u64,
    /// Group rows deleted.
    pub forgotten: u64,
    /// The last name read: the next page starts after it. `None` when the
    /// page was the last.
    pub next: Option<String>,
}

/// The page of group rows after `$after` (at most `$limit`, by name), each
/// with whether it is idle. `$due` and `$leases` name the receipts table as
/// the claim index and the lease index are read (SQLite names its indexes).
/// The groups with a lease or a hold are read once for the page, from the
/// partial indexes that hold only those rows: neither is ordered by group.
macro_rules! idle_groups_sql {
    ($due:literal, $leases:literal, $after:literal, $limit:literal) => {
        concat!(
            "WITH page AS MATERIALIZED (SELECT name, paused, max_leased, rate_per_s, burst \
               FROM receipt_groups WHERE name > ",
            $after,
            " ORDER BY name LIMIT ",
            $limit,
            "), busy AS MATERIALIZED (SELECT receipt_group FROM ",
            $leases,
            " WHERE lease_until_ms IS NOT NULL \
               UNION SELECT receipt_group FROM receipts \
               WHERE status = 'active' AND held_at_ms IS NOT NULL) \
             SELECT p.name, (NOT p.paused AND p.max_leased IS NULL AND p.rate_per_s IS NULL \
               AND p.burst IS NULL AND p.name <> 'default' \
               AND NOT EXISTS (SELECT 1 FROM ",
            $due,
            " WHERE receipt_group = p.name AND ",
            $crate::store::rules::unleased_sql!(),
            ") AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.receipt_group = p.name)) AS idle \
             FROM page AS p ORDER BY p.name"
        )
    };
}
pub(crate) use idle_groups_sql;

/// The delete of the idle groups named (`$names`), each checked again for
/// limits (the page was read in the same transaction; this keeps the delete
/// safe on its own).
macro_rules! forget_groups_sql {
    ($names:literal) => {
        concat!(
            "DELETE FROM receipt_groups WHERE name IN (SELECT value FROM ",
            $names,
            ") AND NOT paused AND max_leased IS NULL AND rate_per_s IS NULL AND burst IS NULL"
        )
    };
}
pub(crate) use forget_groups_sql;

/// The sweep's figures from the page read (`(name, idle)` in name order) and
/// the number deleted.
#[must_use]
pub fn swept(page: &[(String, bool)], forgotten: u64, limit: usize) -> SweptGroups {
    SweptGroups {
        looked: page.len() as u64,
        forgotten,
        next: if page.len() < limit {
            None
        } else {
            page.last().map(|(name, _)| name.clone())
        },
    }
}

/// The idle names of a page.
#[must_use]
pub fn idle_names(page: &[(String, bool)]) -> Vec<&str> {
    page.iter()
        .filter(|(_, idle)| *idle)
        .map(|(name, _)| name.as_str())
        .collect()
}
