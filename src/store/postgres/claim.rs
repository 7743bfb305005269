//! Claims: by id under a row lock, or a batch as one
//! `FOR UPDATE SKIP LOCKED` statement that is all or nothing.

use std::collections::HashMap;

use sqlx::PgConnection;

use super::claim_batch::ClaimJob;
use super::groups::{Covered, admit_one, groups_for_claim, retake, spend};
use super::writes::Job;
use super::{PostgresStore, Tx, begin_claim, finish, row_for_update};
use crate::domain::{
    Candidate, ClaimLimit, Claimed, GroupName, LeaseMs, ReceiptId, StoreError, UnixMs, WorkerId,
};
use crate::store::fair::{DueClaims, FairClaim, Turn, claim_order, turn_after};
use crate::store::rows::ReceiptRow;
use crate::store::rules::{
    claimable_sql, lapsed_sql, priority_below_sql, top_priority_sql, unleased_sql,
};
use crate::store::walk::{walk_bound, walked_enough};
use crate::store::{ClaimAsk, ReceiptClaim, Reported, StoreResult, rules};

/// The priorities in use among the claimable rows holding no lease of each
/// group `$2[g]` (with its depth or quota `$3[g]` and position `n`), highest
/// first: one probe of `receipts_due` per priority (a loose index scan), so
/// that each is then read as its own index range `(group, priority, due <=
/// now)`, which ends at the first row not yet due. Leased rows are not in
/// that index (migrations/postgres/0014_unleased_due.sql).
macro_rules! group_levels {
    () => {
        concat!(
            "WITH RECURSIVE q AS (SELECT * FROM unnest($2::text[], $3::int8[]) WITH ORDINALITY \
               AS q (name, quota, n)), \
             levels (n, name, quota, p) AS (SELECT n, name, quota, ",
            top_priority_sql!("receipts", "q.name"),
            " FROM q UNION ALL SELECT n, name, quota, ",
            priority_below_sql!("receipts", "l.name", "l.p"),
            " FROM levels AS l WHERE l.p IS NOT NULL), "
        )
    };
}

/// The groups with a lapsed lease due, read once from `receipts_leases` for
/// the whole claim. On a server that has run longer than its leases that
/// range holds an entry for every leased row version not yet vacuumed, and
/// reading it once per group made a claim over 1 000 groups read it 1 000
/// times (docs/perf-log/postgres-write-path.md, "A server that has run longer than its
/// leases").
macro_rules! lapsed_groups {
    () => {
        concat!(
            "lapsed AS MATERIALIZED (SELECT DISTINCT receipt_group FROM receipts WHERE ",
            lapsed_sql!("$1"),
            " AND next_visible_at_ms <= $1), "
        )
    };
}

/// The first due rows holding no lease of one priority `l.p` of a group, in
/// claim order.
macro_rules! level_due {
    () => {
        concat!(
            "FROM receipts WHERE receipt_group = l.name AND priority = l.p AND ",
            unleased_sql!(),
            " AND next_visible_at_ms <= $1 ORDER BY next_visible_at_ms, receipt_id LIMIT l.quota"
        )
    };
}

/// The first due rows of group `q.name` whose lease expired, in claim
/// order: a range of `receipts_leases`, as long as the expired leases.
macro_rules! expired_due {
    () => {
        concat!(
            "FROM receipts WHERE ",
            lapsed_sql!("$1"),
            " AND receipt_group = q.name AND next_visible_at_ms <= $1 \
             ORDER BY priority DESC, next_visible_at_ms, receipt_id LIMIT q.quota"
        )
    };
}

/// Lease each group's first due rows, `$3[g]` of group `$2[g]` (highest
/// priority first, then oldest due), skipping rows other transactions hold,
/// numbered in round-robin order (each group's first, then each group's
/// second, …; within a round oldest due first). Each claim position has its
/// owner, token (made in Rust) and deadline (`$4`, `$5`, `$6`), so that the
/// batch claims of several workers can share the statement. An
/// out-of-range version is left as it is, for Rust to refuse before commit.
/// The update finds each row by the tuple the lock returned (`ctid`: the
/// row is locked, so it stays where it is until commit) instead of a second
/// descent of the primary key: one scan of those tuples (`ctid = ANY`), the
/// key compared as `IS NOT DISTINCT FROM` (the same test on a key that is
/// never NULL) so that no index can serve it, and the claim positions
/// joined to their slots before, among rows the planner counts by the
/// million, so that it hashes one side. On an analyzed table, `receipt_id =
/// pick_id` took the key, and the slots joined after the tuples (which it
/// counts as ten) were scanned once per row (docs/perf-log/postgres-write-path.md,
/// "With statistics").
/// With several priorities due in a group, rows of a lower one may be
/// locked and left as they are until commit (each priority is read up to
/// the quota).
pub(super) const CLAIM_DUE: &str = concat!(
    group_levels!(),
    lapsed_groups!(),
    "locked AS (SELECT d.*, l.n AS grp, l.quota FROM levels AS l CROSS JOIN LATERAL \
       (SELECT ctid AS at, receipt_id, row_version, next_visible_at_ms, lease_until_ms, priority ",
    level_due!(),
    " FOR UPDATE SKIP LOCKED) AS d WHERE l.p IS NOT NULL \
       UNION ALL SELECT e.*, q.n, q.quota FROM q JOIN lapsed ON lapsed.receipt_group = q.name \
       CROSS JOIN LATERAL \
       (SELECT ctid AS at, receipt_id, row_version, next_visible_at_ms, lease_until_ms, priority ",
    expired_due!(),
    " FOR UPDATE SKIP LOCKED) AS e), \
     ranked AS (SELECT *, row_number() OVER (PARTITION BY grp \
       ORDER BY priority DESC, next_visible_at_ms, receipt_id) AS round FROM locked), \
     picked AS (SELECT at AS pick_at, receipt_id AS pick_id, row_version AS prior_version, \
       lease_until_ms AS prior_until, pick, slot_owner, slot_token, slot_until \
       FROM (SELECT *, row_number() OVER (ORDER BY round, next_visible_at_ms, receipt_id) AS pick \
         FROM ranked WHERE round <= quota) AS p \
       JOIN unnest($4::text[], $5::text[], $6::int8[]) WITH ORDINALITY \
         AS slots (slot_owner, slot_token, slot_until, slot) ON slot = pick) \
     UPDATE receipts SET row_version = CASE WHEN prior_version BETWEEN 0 AND 9223372036854775806 \
       THEN prior_version + 1 ELSE prior_version END, \
       lease_owner = slot_owner, lease_token = slot_token, lease_until_ms = slot_until \
     FROM picked WHERE receipts.ctid = ANY (ARRAY(SELECT pick_at FROM picked)) AND receipts.ctid = pick_at \
       AND receipt_id IS NOT DISTINCT FROM pick_id RETURNING pick, prior_version, prior_until, ",
    pg_receipt_columns!()
);

/// Each group's first `$3[g]` due rows of each priority of group `$2[g]`,
/// unlocked: what a fair claim reads to share itself out before it leases
/// (cut to each group's first `$3[g]` in Rust).
const READ_DUE: &str = concat!(
    group_levels!(),
    lapsed_groups!(),
    "d AS (SELECT l.n - 1 AS grp, receipt_id, next_visible_at_ms, priority FROM levels AS l \
       CROSS JOIN LATERAL (SELECT receipt_id, next_visible_at_ms, priority ",
    level_due!(),
    ") AS r WHERE l.p IS NOT NULL \
       UNION ALL SELECT q.n - 1, e.receipt_id, e.next_visible_at_ms, e.priority FROM q \
       JOIN lapsed ON lapsed.receipt_group = q.name \
       CROSS JOIN LATERAL (SELECT receipt_id, next_visible_at_ms, priority ",
    expired_due!(),
    ") AS e) SELECT grp, receipt_id, next_visible_at_ms, priority FROM d"
);

/// Share a claim of `wanted` out over the groups: read their due rows in
/// passes until the round robin is known; the quota of each group.
async fn share_out(
    conn: &mut PgConnection,
    fair: &mut FairClaim,
    now: i64,
) -> StoreResult<Vec<u64>> {
    while let Some(reads) = fair.next_reads() {
        if reads.len() == 1 && fair.groups.len() == 1 {
            // One group: its quota is what it may give, no read needed (the
            // lease skips what others hold, as a read could not).
            return Ok(vec![reads[0].1]);
        }
        let names: Vec<&str> = reads
            .iter()
            .map(|&(g, _)| fair.groups[g].name.as_str())
            .collect();
        let depths: Vec<i64> = reads
            .iter()
            .map(|&(_, d)| i64::try_from(d).unwrap_or(i64::MAX))
            .collect();
        let mut rows: Vec<(i64, String, i64, i16)> = sqlx::query_as(READ_DUE)
            .bind(now)
            .bind(&names)
            .bind(&depths)
            .fetch_all(&mut *conn)
            .await?;
        // Each group's rows in claim order: highest priority, then oldest due.
        rows.sort_by(|a, b| {
            (a.0, claim_order(a.3, a.2, &a.1)).cmp(&(b.0, claim_order(b.3, b.2, &b.1)))
        });
        let mut found: Vec<Vec<Candidate>> = vec![Vec::new(); reads.len()];
        for (i, receipt_id, next_visible_at_ms, _) in rows {
            if let Some(f) = usize::try_from(i).ok().and_then(|i| found.get_mut(i)) {
                f.push(Candidate {
                    receipt_id,
                    next_visible_at_ms,
                });
            }
        }
        for (&(g, depth), mut due) in reads.iter().zip(found) {
            due.truncate(usize::try_from(depth).unwrap_or(usize::MAX));
            fair.read(g, depth, due);
        }
    }
    Ok(fair.quotas())
}

/// Lease one row read (and locked) in the same transaction.
const LEASE: &str = concat!(
    "UPDATE receipts SET row_version = $3, lease_owner = $4, lease_token = $5, lease_until_ms = $6 \
     WHERE receipt_id = $1 AND row_version = $2 AND ",
    claimable_sql!("$7"),
    " RETURNING ",
    pg_receipt_columns!()
);

/// A row leased by [`CLAIM_DUE`], with its claim position and prior version.
#[derive(sqlx::FromRow)]
struct ClaimedRow {
    pick: i64,
    prior_version: i64,
    prior_until: Option<i64>,
    #[sqlx(flatten)]
    row: ReceiptRow,
}

async fn claim_one(
    tx: &mut Tx,
    receipt_id: &ReceiptId,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<ReceiptClaim> {
    let Some(row) = row_for_update(tx, receipt_id.as_str()).await? else {
        return Ok(ReceiptClaim::NoActiveWork);
    };
    if let Some(refused) = row.unclaimable(now) {
        return Ok(refused);
    }
    if let Err(paused) = admit_one(tx, &row.receipt_group, now).await? {
        return Ok(ReceiptClaim::GroupLimited { paused });
    }
    let version = rules::next_row_version(row.row_version)?;
    let leased: Option<ReceiptRow> = sqlx::query_as(LEASE)
        .bind(&row.receipt_id)
        .bind(row.row_version)
        .bind(version)
        .bind(worker_id.as_str())
        .bind(rules::new_lease_token(now)?)
        .bind(until)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?;
    let leased = leased.ok_or_else(rules::changed_while_claimed)?;
    // A due row that still holds a lease holds an expired one.
    Ok(ReceiptClaim::Claimed(Box::new(
        leased.claimed(row.lease_until_ms)?,
    )))
}

/// A fair claim leased to `slots` (owner and deadline per claim position,
/// in order): the claims in position order, fewer when fewer rows are due
/// or limits hold them back.
pub(super) async fn lease_due(
    conn: &mut PgConnection,
    slots: &[(&str, i64)],
    now: i64,
    only: &[GroupName],
    turn: &Turn,
) -> StoreResult<DueClaims<Claimed>> {
    let (after, wanted) = (turn_after(turn), slots.len() as u64);
    let bound = Some(walk_bound(wanted));
    let (mut fair, covered) = groups_for_claim(conn, only, &after, now, wanted, bound).await?;
    let mut quotas = share_out(conn, &mut fair, now).await?;
    if covered != Covered::All && !walked_enough(&quotas, wanted) {
        retake(conn, covered).await?;
        (fair, _) = groups_for_claim(conn, only, &after, now, wanted, None).await?;
        quotas = share_out(conn, &mut fair, now).await?;
    }
    fair.pass_turn(turn, &quotas);
    let (names, quotas): (Vec<&str>, Vec<i64>) = fair
        .groups
        .iter()
        .zip(&quotas)
        .filter(|(_, q)| **q > 0)
        .map(|(g, q)| (g.name.as_str(), i64::try_from(*q).unwrap_or(i64::MAX)))
        .unzip();
    if names.is_empty() {
        return Ok(fair.answer(Vec::new()));
    }
    let tokens = slots
        .iter()
        .map(|_| rules::new_lease_token(now))
        .collect::<StoreResult<Vec<_>>>()?;
    let mut rows: Vec<ClaimedRow> = sqlx::query_as(CLAIM_DUE)
        .bind(now)
        .bind(&names)
        .bind(&quotas)
        .bind(slots.iter().map(|(owner, _)| *owner).collect::<Vec<_>>())
        .bind(tokens)
        .bind(slots.iter().map(|(_, until)| *until).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    rows.sort_by_key(|r| r.pick);
    // What each group gave, counted in one pass over the rows.
    let mut by_group: HashMap<&str, u64> = HashMap::new();
    for r in &rows {
        *by_group.entry(r.row.receipt_group.as_str()).or_default() += 1;
    }
    let taken: Vec<u64> = fair
        .groups
        .iter()
        .map(|g| by_group.get(g.name.as_str()).copied().unwrap_or(0))
        .collect();
    spend(conn, fair.spent(&taken)).await?;
    let claims = rows
        .iter()
        .map(|r| {
            if rules::next_row_version(r.prior_version)? != r.row.row_version {
                return Err(StoreError::invalid_record("row_version did not advance"));
            }
            r.row.claimed(r.prior_until)
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(fair.answer(claims))
}

impl PostgresStore {
    pub(super) async fn claim_receipt_by_id(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        let now = now_ms.as_i64();
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let mut tx = begin_claim(&self.pool).await?;
        let result = claim_one(&mut tx, receipt_id, worker_id, now, until).await;
        finish(tx, result).await
    }

    pub(super) async fn claim_due_batch(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        let ask = ClaimAsk {
            worker_id,
            now_ms,
            lease_ms,
            limit,
            only,
        };
        self.queue_claim(ask, None).await?.claimed
    }

    /// A claim through the claim queue, after the outcomes `carried` (a
    /// [`Job::Outcomes`]) when there are any.
    pub(super) async fn queue_claim(
        &self,
        ask: ClaimAsk<'_>,
        carried: Option<Job>,
    ) -> StoreResult<Reported> {
        let now = ask.now_ms.as_i64();
        let until = rules::lease_deadline(ask.now_ms, ask.lease_ms.get())?;
        self.claims
            .run(ClaimJob {
                worker_id: ask.worker_id.clone(),
                now,
                until,
                limit: ask.limit.get(),
                only: ask.only.to_vec(),
                carried,
            })
            .await
    }
}
