//! The SQL both backends share for the rules: the claim compare-and-swap,
//! the claimable conditions and the history column list, each written once.

/// The claim compare-and-swap in SQL, what `domain::holds` states in Rust:
/// the row is active, equals the claim field for field, and its lease is
/// live at the check time. One text for every guarded write of both
/// backends; the arguments say where each claim value comes from (a bound
/// parameter or a batch column), and `$status` and `$lease_end` how to name
/// the status and lease end columns, so that a planner takes the primary
/// key: a `+` in front keeps it off the indexes on that column. SQLite
/// needs `+status` (and its plain lease end: `+lease_until_ms` halved its
/// batched cycle); PostgreSQL an expression that hides `receipts_leases`
/// altogether (`postgres::guarded::pg_cas`).
macro_rules! cas_sql {
    ($status:literal, $lease_end:literal; $id:literal, $fin:literal, $att:literal, $rv:literal,
     $owner:literal, $token:literal, $until:literal, $now:literal) => {
        concat!(
            "receipt_id = ",
            $id,
            " AND ",
            $status,
            " = 'active' AND finalized_at = ",
            $fin,
            " AND attempts = ",
            $att,
            " AND row_version = ",
            $rv,
            " AND lease_owner = ",
            $owner,
            " AND lease_token = ",
            $token,
            " AND ",
            $lease_end,
            " = ",
            $until,
            " AND ",
            $lease_end,
            " > ",
            $now
        )
    };
}
pub(crate) use cas_sql;

/// What recording an outcome sets on its receipt, written once for every
/// statement that records outcomes (SQLite's one-row and batched updates,
/// PostgreSQL's write round), as `domain::rules` plans it: the new status
/// and its fields, the attempts and failure kept when the plan leaves them
/// NULL, the rail code replaced with each new failure, the lease given
/// back. Each argument names where a planned value comes from; `$table` is
/// what names the row's own columns (`receipts.` in an `UPDATE … FROM`).
macro_rules! outcome_set_sql {
    ($table:literal; status = $status:literal, transcript = $transcript:literal,
     reason = $reason:literal, attempts = $attempts:literal, visible = $visible:literal,
     code = $code:literal, sha = $sha:literal, finished = $finished:literal,
     rail = $rail:literal) => {
        concat!(
            "status = ",
            $status,
            ", transcript_id = ",
            $transcript,
            ", skip_reason = ",
            $reason,
            ", attempts = coalesce(",
            $attempts,
            ", ",
            $table,
            "attempts)",
            ", next_visible_at_ms = ",
            $visible,
            ", failure_code = coalesce(",
            $code,
            ", ",
            $table,
            "failure_code)",
            ", failure_sha256 = coalesce(",
            $sha,
            ", ",
            $table,
            "failure_sha256)",
            ", failure_rail_code = CASE WHEN ",
            $code,
            " IS NULL THEN ",
            $table,
            "failure_rail_code ELSE ",
            $rail,
            " END",
            ", lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL",
            ", finished_at_ms = ",
            $finished
        )
    };
}
pub(crate) use outcome_set_sql;

/// Claimable once due and holding no lease: the predicate of each backend's
/// claim index `receipts_due` (migrations/*/0014_unleased_due.sql), written
/// once so that every query meant for that index names it alike.
macro_rules! unleased_sql {
    () => {
        "status = 'active' AND held_at_ms IS NULL AND lease_token IS NULL"
    };
}
pub(crate) use unleased_sql;

/// The highest priority among the rows of group `$group` holding no lease
/// (read from `$table`, which may name the claim index for SQLite), and the
/// next one below `$below`: the steps of a loose index scan of
/// `receipts_due` `(group, priority, due, id)`, one probe per priority in
/// use, which claims and the groups list walk alike.
macro_rules! top_priority_sql {
    ($table:literal, $group:literal) => {
        concat!(
            "(SELECT priority FROM ",
            $table,
            " WHERE receipt_group = ",
            $group,
            " AND ",
            unleased_sql!(),
            " ORDER BY priority DESC LIMIT 1)"
        )
    };
}
pub(crate) use top_priority_sql;

/// See [`top_priority_sql`].
macro_rules! priority_below_sql {
    ($table:literal, $group:literal, $below:literal) => {
        concat!(
            "(SELECT priority FROM ",
            $table,
            " WHERE receipt_group = ",
            $group,
            " AND ",
            unleased_sql!(),
            " AND priority < ",
            $below,
            " ORDER BY priority DESC LIMIT 1)"
        )
    };
}
pub(crate) use priority_below_sql;

/// The first group after `$after` with rows holding no lease: one probe
/// of `receipts_due` (read from `$table`, which may name it for SQLite).
macro_rules! next_group_sql {
    ($table:literal, $after:literal) => {
        concat!(
            "(SELECT receipt_group FROM ",
            $table,
            " WHERE receipt_group > ",
            $after,
            " AND ",
            unleased_sql!(),
            " ORDER BY receipt_group LIMIT 1)"
        )
    };
}
pub(crate) use next_group_sql;

/// The groups a claim looks at when it names none: those with rows holding
/// no lease, in turn order from the first after `$after` (wrapping around
/// to it), at most `$bound` of them (`walked` 1), one probe of
/// `receipts_due` each; and those with a lapsed lease due at `$now` (from
/// `$leases`, `walked` 0). Each with its limits, when it has any. A group
/// with nothing active costs a claim nothing however many were ever named,
/// and a claim over many groups with work walks as many as it may need
/// (docs/groups.md, "What it costs"; `store::fair::walked_groups`).
macro_rules! claim_groups_sql {
    ($table:literal, $leases:literal, $now:literal, $after:literal, $bound:literal) => {
        concat!(
            "WITH RECURSIVE a (name, n) AS (SELECT ",
            next_group_sql!($table, $after),
            ", 1 UNION ALL SELECT ",
            next_group_sql!($table, "a.name"),
            ", a.n + 1 FROM a WHERE a.name IS NOT NULL AND a.n < ",
            $bound,
            "), c (k) AS (SELECT COUNT(*) FROM a WHERE name IS NOT NULL), \
             b (name, n, k) AS (SELECT ",
            next_group_sql!($table, "''"),
            ", 1, c.k FROM c WHERE c.k < ",
            $bound,
            " UNION ALL SELECT ",
            next_group_sql!($table, "b.name"),
            ", b.n + 1, b.k FROM b WHERE b.name IS NOT NULL AND b.name <= ",
            $after,
            " AND b.n + b.k < ",
            $bound,
            "), named (name, walked) AS (SELECT name, 1 FROM a WHERE name IS NOT NULL \
               UNION ALL SELECT name, 1 FROM b WHERE name IS NOT NULL AND name <= ",
            $after,
            " UNION ALL SELECT DISTINCT receipt_group, 0 FROM ",
            $leases,
            " WHERE ",
            lapsed_sql!($now),
            " AND next_visible_at_ms <= ",
            $now,
            ") SELECT n.name, COALESCE(g.paused, false) AS paused, g.max_leased, g.rate_per_s, \
               g.burst, g.tokens, g.tokens_at_ms, n.walked \
             FROM named AS n LEFT JOIN receipt_groups AS g ON g.name = n.name"
        )
    };
}
pub(crate) use claim_groups_sql;

/// Claimable once due, its lease lapsed at `$now`: a range of
/// `receipts_leases`. A lease implies an active row (a CHECK of each
/// backend's table), so the status is not named: SQLite's index carries the
/// hold and the group, and a read of those alone stays in the index
/// (migrations/sqlite/0016_leases_cover_groups.sql).
macro_rules! lapsed_sql {
    ($now:literal) => {
        concat!("lease_until_ms <= ", $now, " AND held_at_ms IS NULL")
    };
}
pub(crate) use lapsed_sql;

/// Claimable at `$now`: due, and holding no lease or a lapsed one: the SQL of
/// what [`ReceiptRow::unclaimable`] answers `None` for, for a claim of one
/// receipt by id.
macro_rules! claimable_sql {
    ($now:literal) => {
        concat!(
            "status = 'active' AND held_at_ms IS NULL AND next_visible_at_ms <= ",
            $now,
            " AND (lease_until_ms IS NULL OR lease_until_ms <= ",
            $now,
            ")"
        )
    };
}
pub(crate) use claimable_sql;

/// The head of every history `INSERT` of both backends ([`NewHistory`]'s
/// columns in one order); each statement supplies all of them.
macro_rules! history_insert {
    () => {
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
         transcript_id, reason, worker_id, observed_at_ms, route, retry_after_ms, actor, note, \
         rail_code) "
    };
}
pub(crate) use history_insert;
