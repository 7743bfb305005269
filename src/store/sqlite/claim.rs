//! Claims on SQLite, on the writer's connection: by id, or a fair claim over
//! the groups (docs/groups.md) that reads their due rows and leases its
//! picks. One writer runs every claim, so the rows and limits it reads
//! cannot change under it.

use std::collections::HashMap;

use rusqlite::Connection;

use super::groups::{admit_one, live_leased, read_groups, spend};
use super::lookup::{json, receipt_row, row, rows_by_id};
use crate::domain::{Candidate, ClaimLimit, Claimed, GroupName, ReceiptId, StoreError, WorkerId};
use crate::store::fair::{DueClaims, FairClaim, Turn, claim_order, turn_after};
use crate::store::rows::{ReceiptRow, receipt_columns};
use crate::store::rules::{
    claimable_sql, lapsed_sql, priority_below_sql, top_priority_sql, unleased_sql,
};
use crate::store::walk::{walk_bound, walked_enough};
use crate::store::{ReceiptClaim, StoreResult, rules};

/// The priorities in use among the claimable rows holding no lease of each
/// group named in `?1` (a JSON array; `key` is the position in it), highest
/// first: one probe of `receipts_due` per priority (a loose index scan), so
/// that each is then read as its own index range `(group, priority, due <=
/// now)`, which ends at the first row not yet due. Leased rows are not in
/// that index (migrations/sqlite/0014_unleased_due.sql).
macro_rules! group_levels {
    () => {
        concat!(
            "WITH RECURSIVE levels (key, name, p) AS (SELECT q.key, q.value, ",
            top_priority_sql!("receipts INDEXED BY receipts_due", "q.value"),
            " FROM json_each(?1) AS q UNION ALL SELECT l.key, l.name, ",
            priority_below_sql!("receipts INDEXED BY receipts_due", "l.name", "l.p"),
            " FROM levels AS l WHERE l.p IS NOT NULL) "
        )
    };
}

/// The first `?3` due rows holding no lease of each priority of each group
/// of `levels`, then (`UNION ALL`, the same columns from `r`) each group's
/// first `?3` due rows whose lease expired, from `receipts_leases`.
macro_rules! level_due {
    ($($columns:tt)+) => {
        concat!(
            $($columns)+,
            " FROM levels AS l, receipts AS r WHERE l.p IS NOT NULL AND r.receipt_id IN \
             (SELECT receipt_id FROM receipts INDEXED BY receipts_due WHERE receipt_group = l.name \
               AND priority = l.p AND ",
            unleased_sql!(),
            " AND next_visible_at_ms <= ?2 \
               ORDER BY next_visible_at_ms, receipt_id LIMIT CAST(?3 AS INTEGER)) \
             UNION ALL ",
            $($columns)+,
            " FROM json_each(?1) AS l, receipts AS r WHERE r.receipt_id IN \
             (SELECT receipt_id FROM receipts INDEXED BY receipts_leases WHERE ",
            lapsed_sql!("?2"),
            " AND receipt_group = l.value AND next_visible_at_ms <= ?2 \
               ORDER BY priority DESC, next_visible_at_ms, receipt_id LIMIT CAST(?3 AS INTEGER))"
        )
    };
}

/// The first `?3` due receipts of each priority of each group named in
/// `?1`: only the keys, in one statement, so that a claim over many groups
/// costs one call, not one per group (the rows it takes are read whole
/// afterwards); cut to each group's first `?3` in Rust. `CAST` on the
/// limit: a bare bound `LIMIT` makes SQLite prepare the statement again
/// every call.
const PICK_DUE: &str = concat!(
    group_levels!(),
    level_due!("SELECT l.key, r.receipt_id, r.next_visible_at_ms, r.priority")
);

/// One group's (`?1`, a JSON array of one name) first `?3` due rows of each
/// priority, whole (cut to the first `?3` in claim order in Rust).
const PICK_ONE_GROUP: &str = concat!(group_levels!(), level_due!("SELECT ", receipt_columns!()));

fn group_rows(
    conn: &Connection,
    group: &str,
    now: i64,
    depth: u64,
) -> StoreResult<Vec<ReceiptRow>> {
    let mut stmt = conn.prepare_cached(PICK_ONE_GROUP)?;
    let mut rows: Vec<ReceiptRow> = stmt
        .query_map(
            rusqlite::params![
                json(&[group])?,
                now,
                i64::try_from(depth).unwrap_or(i64::MAX)
            ],
            receipt_row,
        )?
        .collect::<Result<_, _>>()?;
    let key = |r: &ReceiptRow| r.next_visible_at_ms.unwrap_or_default();
    rows.sort_by(|a, b| {
        claim_order(a.priority, key(a), &a.receipt_id).cmp(&claim_order(
            b.priority,
            key(b),
            &b.receipt_id,
        ))
    });
    rows.truncate(usize::try_from(depth).unwrap_or(usize::MAX));
    Ok(rows)
}

/// Read each group of `reads` (`(g, depth)`) to its depth: one statement
/// at the deepest depth, each group cut to its own.
fn read_due(
    conn: &Connection,
    fair: &mut FairClaim,
    reads: &[(usize, u64)],
    now: i64,
) -> StoreResult<()> {
    let names: Vec<&str> = reads
        .iter()
        .map(|&(g, _)| fair.groups[g].name.as_str())
        .collect();
    let deepest = reads.iter().map(|&(_, d)| d).max().unwrap_or(0);
    let mut found: Vec<Vec<(i16, Candidate)>> = vec![Vec::new(); reads.len()];
    {
        let mut stmt = conn.prepare_cached(PICK_DUE)?;
        let rows = stmt.query_map(
            rusqlite::params![
                json(&names)?,
                now,
                i64::try_from(deepest).unwrap_or(i64::MAX)
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i16>(3)?,
                    Candidate {
                        receipt_id: r.get(1)?,
                        next_visible_at_ms: r.get(2)?,
                    },
                ))
            },
        )?;
        for row in rows {
            let (i, priority, candidate) = row?;
            if let Some(f) = usize::try_from(i).ok().and_then(|i| found.get_mut(i)) {
                f.push((priority, candidate));
            }
        }
    }
    for (&(g, depth), mut due) in reads.iter().zip(found) {
        due.sort_by(|(pa, a), (pb, b)| {
            claim_order(*pa, a.next_visible_at_ms, &a.receipt_id).cmp(&claim_order(
                *pb,
                b.next_visible_at_ms,
                &b.receipt_id,
            ))
        });
        due.truncate(usize::try_from(depth).unwrap_or(usize::MAX));
        fair.read(g, depth, due.into_iter().map(|(_, c)| c).collect());
    }
    Ok(())
}

/// Read the groups (a walk of at most `bound` with work when none is named)
/// and their due rows until the round robin is known: the claim, the rows
/// read whole (one group alone), and whether every group was looked at.
fn share_out(
    conn: &Connection,
    only: &[GroupName],
    now: i64,
    after: &str,
    wanted: u64,
    bound: Option<u64>,
) -> StoreResult<(FairClaim, HashMap<String, ReceiptRow>, bool)> {
    let (groups, complete) = read_groups(conn, only, now, after, bound)?;
    let live = live_leased(conn, &groups, now)?;
    let mut fair = FairClaim::new(groups, &live, now, wanted);
    let mut rows: HashMap<String, ReceiptRow> = HashMap::new();
    match fair.next_reads() {
        // One group (the default group alone, say): its rows in one read,
        // whole, as they will be leased.
        Some(reads) if fair.groups.len() == 1 => {
            let (g, depth) = reads[0];
            let due = group_rows(conn, &fair.groups[g].name, now, depth)?;
            let keys = due
                .iter()
                .map(|r| Candidate {
                    receipt_id: r.receipt_id.clone(),
                    next_visible_at_ms: r.next_visible_at_ms.unwrap_or_default(),
                })
                .collect();
            rows.extend(due.into_iter().map(|r| (r.receipt_id.clone(), r)));
            fair.read(g, depth, keys);
        }
        Some(reads) => {
            read_due(conn, &mut fair, &reads, now)?;
            while let Some(reads) = fair.next_reads() {
                read_due(conn, &mut fair, &reads, now)?;
            }
        }
        None => {}
    }
    Ok((fair, rows, complete))
}

/// A fair claim over `only` (empty: every group), all or nothing, its
/// turn starting after `turn`'s group.
pub fn claim_due(
    conn: &Connection,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
    limit: ClaimLimit,
    only: &[GroupName],
    turn: &Turn,
) -> StoreResult<DueClaims<Claimed>> {
    let (after, wanted) = (turn_after(turn), limit.get() as u64);
    let bound = Some(walk_bound(wanted));
    let (mut fair, mut rows, complete) = share_out(conn, only, now, &after, wanted, bound)?;
    if !complete && !walked_enough(&fair.quotas(), wanted) {
        (fair, rows, _) = share_out(conn, only, now, &after, wanted, None)?;
    }
    let picks = fair.picks();
    if rows.is_empty() {
        // The one writer read these keys just now: the rows are as they were.
        rows = rows_by_id(conn, picks.iter().map(|(_, c)| c.receipt_id.as_str()))?;
    }
    let mut taken = vec![0; fair.groups.len()];
    let mut claims = Vec::with_capacity(picks.len());
    for (g, pick) in picks {
        let row = rows
            .remove(&pick.receipt_id)
            .ok_or_else(|| StoreError::backend("a picked row was not read"))?;
        taken[g] += 1;
        // A failure fails the job, rolling back every lease of the batch.
        claims.push(lease(conn, row, worker_id, now, until)?);
    }
    spend(conn, &fair.spent(&taken))?;
    fair.pass_turn(turn, &taken);
    Ok(fair.answer(claims))
}

/// Lease one due row that was just read, checking that it is unchanged.
/// No `RETURNING`: the claim is the row as read with what was set (SQLite
/// collects `RETURNING` rows in a temporary table per statement).
pub(super) fn lease(
    conn: &Connection,
    mut row: ReceiptRow,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<Claimed> {
    let version = rules::next_row_version(row.row_version)?;
    let token = rules::new_lease_token(now)?;
    let changed = conn
        .prepare_cached(concat!(
            "UPDATE receipts SET row_version = ?3, lease_owner = ?4, lease_token = ?5, \
             lease_until_ms = ?6 WHERE receipt_id = ?1 AND row_version = ?2 AND ",
            claimable_sql!("?7")
        ))?
        .execute(rusqlite::params![
            row.receipt_id,
            row.row_version,
            version,
            worker_id.as_str(),
            token,
            until,
            now
        ])?;
    if changed != 1 {
        return Err(rules::changed_while_claimed());
    }
    row.row_version = version;
    // A due row that still holds a lease holds an expired one.
    let replaced_until = row.lease_until_ms;
    row.lease_owner = Some(worker_id.as_str().to_owned());
    row.lease_token = Some(token);
    row.lease_until_ms = Some(until);
    row.claimed(replaced_until)
}

/// Claim one receipt by id.
pub fn claim_receipt(
    conn: &Connection,
    receipt_id: &ReceiptId,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<ReceiptClaim> {
    let Some(row) = row(conn, receipt_id.as_str())? else {
        return Ok(ReceiptClaim::NoActiveWork);
    };
    if let Some(refused) = row.unclaimable(now) {
        return Ok(refused);
    }
    if let Err(paused) = admit_one(conn, &row.receipt_group, now)? {
        return Ok(ReceiptClaim::GroupLimited { paused });
    }
    Ok(ReceiptClaim::Claimed(Box::new(lease(
        conn, row, worker_id, now, until,
    )?)))
}

#[cfg(test)]
mod tests {
    use super::{PICK_DUE, PICK_ONE_GROUP, Turn, claim_due};
    use crate::domain::{ClaimLimit, WorkerId};

    #[test]
    fn the_claim_statement_is_prepared_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let conn = rusqlite::Connection::open(dir.path().join("plan.db")).expect("open");
        // Every migration, as the server applies them.
        for migration in sqlx::migrate!("migrations/sqlite").iter() {
            conn.execute_batch(migration.sql.as_ref()).expect("schema");
        }
        let worker = WorkerId::parse("w").expect("worker");
        // The default group alone, then two groups.
        for round in 0..2 {
            for (now, limit) in [(10, 1), (11, 7), (12, 1024)] {
                let limit = ClaimLimit::try_from(limit).expect("limit");
                claim_due(&conn, &worker, now, now + 100, limit, &[], &Turn::default())
                    .expect("claim");
            }
            if round == 0 {
                conn.execute(
                    "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, \
                     row_version, created_at_ms, receipt_group, next_visible_at_ms) \
                     VALUES ('r', 1, 'active', 0, 0, 0, 'other', 100)",
                    [],
                )
                .expect("a second group with work");
            }
        }
        for sql in [PICK_ONE_GROUP, PICK_DUE] {
            let stmt = conn.prepare_cached(sql).expect("cached");
            assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
        }
    }
}
