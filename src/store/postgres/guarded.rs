//! Set-based guarded writes: a whole round of outcomes and releases in one
//! statement, extensions in another, each row repeating the whole claim
//! compare-and-swap. A round holds each receipt at most once, because an
//! `UPDATE … FROM` with a repeated key would apply only one arbitrary source
//! row; callers split repeats into successive rounds.

use sqlx::PgConnection;

use super::super::rows::ReceiptRow;
use super::super::rules::{self, Cas, NewHistory, NewValues, Plan, history_insert};
use super::CHANNEL;
use crate::domain::{Claim, Route, StoreError};
use crate::store::StoreResult;

/// The claim fields of the compare-and-swap, owned, with the clock of the check.
#[derive(Debug, Clone)]
pub(super) struct Guard {
    pub receipt_id: String,
    pub finalized_at: i64,
    pub attempts: i64,
    pub row_version: i64,
    pub lease_owner: String,
    pub lease_token: String,
    pub lease_until_ms: i64,
    pub now: i64,
}

impl Guard {
    pub fn of(cas: &Cas<'_>, now: i64) -> Self {
        Self {
            receipt_id: cas.receipt_id.to_owned(),
            finalized_at: cas.finalized_at,
            attempts: cas.attempts,
            row_version: cas.row_version,
            lease_owner: cas.lease_owner.to_owned(),
            lease_token: cas.lease_token.to_owned(),
            lease_until_ms: cas.lease_until_ms,
            now,
        }
    }
}

/// One guarded change and the history entry it appends.
#[derive(Debug, Clone)]
pub(super) struct Write {
    pub guard: Guard,
    pub values: NewValues,
    pub history: NewHistory,
    /// Whether it makes work due at once, to be announced.
    pub wakes: bool,
}

impl Write {
    /// What an outcome's plan writes for `claim`.
    pub fn outcome(claim: &Claim, plan: &Plan) -> Self {
        Self {
            guard: Guard::of(&Cas::of(claim), plan.observed_at_ms),
            values: NewValues::of_plan(plan),
            history: plan.history.clone(),
            wakes: matches!(plan.route, Route::RetryScheduled { .. }),
        }
    }

    /// What a release of `claim` at `now` writes: due again at once.
    pub fn release(claim: &Claim, now: i64) -> Self {
        Self {
            guard: Guard::of(&Cas::of(claim), now),
            values: NewValues::release(now),
            history: rules::release_entry(claim, now),
            wakes: true,
        }
    }
}

/// The claim compare-and-swap on PostgreSQL, the lease end compared as
/// `COALESCE(lease_until_ms, 0)` (the same test: a row without a lease
/// fails it either way). The planner cannot prove `receipts_leases`'s
/// predicate (`lease_until_ms IS NOT NULL`) from that expression, so it
/// cannot take that index and finds each row by its key. Compared on the
/// column, the lease end let an unanalyzed table's plan probe
/// `receipts_leases` on its first two columns; as `+lease_until_ms`, once
/// an `ANALYZE` had seen few leases, the plan scanned that whole index
/// (keyed on its later columns): both read every entry leased since the
/// last vacuum (docs/perf-log/postgres-write-path.md, "An outcome finds its row by its key" and
/// "With statistics").
macro_rules! pg_cas {
    ($($arg:literal),*) => {
        $crate::store::rules::cas_sql!("status", "COALESCE(lease_until_ms, 0)"; $($arg),*)
    };
}
pub(super) use pg_cas;

/// The compare-and-swap of each row against its batch row.
macro_rules! batch_cas {
    () => {
        pg_cas!(
            "b_id",
            "b_fin",
            "b_attempts",
            "b_version",
            "b_owner",
            "b_token",
            "b_until",
            "b_now"
        )
    };
}

/// One guarded update, for exactly the rows it changed one history insert,
/// and the announcement of work made due (a retry, a release) when there is
/// any, which the statement answers as item 0: one statement, atomic even
/// without a transaction around it. It adds the net change of the receipt
/// counts itself (every changed row was active with `b_attempts`, the
/// compare-and-swap says so), to the first counter slot no other
/// transaction holds or to a new one, as the trigger of
/// migrations/postgres/0004_counts.sql would, and sets `settled.counted`
/// so that the trigger leaves this transaction to it (0015). Only this
/// statement and claims, which move no count, run in transactions that set
/// it. Callers pass the batch in id order: the update visits the rows in
/// batch order (the batch drives the join, a nested loop probing the primary
/// key or, while the table's statistics are young, a hash of the table probed
/// by the batch), so two transactions that share receipts lock them in the
/// same order and wait for each other instead of deadlocking. (Locking them first in a `FOR UPDATE`
/// CTE would make sure of it, but costs a lock record per row and a join;
/// `EXPLAIN ANALYZE` put it at more than half the statement.) The history
/// insert takes its columns from the update's `RETURNING`, not from a join
/// of `changed` with `batch` on `b_item`: with that join the batch was
/// materialized and read twice (a hash join; and where the planner expected
/// a single row of the batch, as a filter on it made it in a trial, a
/// nested loop that read the whole batch once per changed row).
pub(super) const WRITE_ROUND: &str = concat!(
    "\
WITH batch AS (SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::text[], \
  $6::text[], $7::int8[], $8::int8[], $9::text[], $10::int8[], $11::int8[], $12::text[], \
  $13::text[], $14::text[], $15::text[], $16::int8[], $17::int8[], $18::text[], $19::text[], \
  $20::text[], $21::text[], $22::text[], $23::text[], $24::int8[], $25::text[], $26::bool[], \
  $28::int8[], $29::text[]) \
  WITH ORDINALITY AS b (b_id, b_fin, b_attempts, b_version, b_owner, b_token, b_until, b_now, \
  b_status, b_new_attempts, b_next_visible, b_code, b_sha, b_transcript, b_skip, b_finished, \
  h_attempt, h_outcome, h_code, h_sha, h_transcript, h_reason, h_worker, h_observed, h_route, \
  b_wakes, h_retry_after, b_rail, b_item)), \
changed AS (UPDATE receipts SET ",
    crate::store::rules::outcome_set_sql!("receipts."; status = "b_status",
        transcript = "b_transcript", reason = "b_skip", attempts = "b_new_attempts",
        visible = "b_next_visible", code = "b_code", sha = "b_sha", finished = "b_finished",
        rail = "b_rail"),
    " FROM batch WHERE ",
    batch_cas!(),
    " RETURNING b_item, b_wakes, b_attempts, receipts.status AS new_status, \
  receipts.attempts AS new_attempts, b_id, h_attempt, h_outcome, h_code, h_sha, h_transcript, \
  h_reason, h_worker, h_observed, h_route, h_retry_after, b_rail), \
moved AS (SELECT set_config('settled.counted', 'on', true) AS counted_here, \
  COUNT(*) FILTER (WHERE new_status = 'active' AND new_attempts = 0) \
    - COUNT(*) FILTER (WHERE b_attempts = 0) AS d_fresh, \
  COUNT(*) FILTER (WHERE new_status = 'active' AND new_attempts > 0) \
    - COUNT(*) FILTER (WHERE b_attempts > 0) AS d_retried, \
  COUNT(*) FILTER (WHERE new_status = 'settled') AS d_settled, \
  COUNT(*) FILTER (WHERE new_status = 'skipped') AS d_skipped, \
  COUNT(*) FILTER (WHERE new_status = 'dead_lettered') AS d_dead FROM changed), \
counted AS (UPDATE receipt_counts SET fresh = fresh + d_fresh, retried = retried + d_retried, \
  settled = settled + d_settled, skipped = skipped + d_skipped, \
  dead_lettered = dead_lettered + d_dead FROM moved \
  WHERE (d_fresh, d_retried, d_settled, d_skipped, d_dead) <> (0, 0, 0, 0, 0) \
  AND slot = (SELECT slot FROM receipt_counts ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED) \
  RETURNING slot), \
spilled AS (INSERT INTO receipt_counts (fresh, retried, settled, skipped, dead_lettered) \
  SELECT d_fresh, d_retried, d_settled, d_skipped, d_dead FROM moved \
  WHERE (d_fresh, d_retried, d_settled, d_skipped, d_dead) <> (0, 0, 0, 0, 0) \
  AND NOT EXISTS (SELECT 1 FROM counted)), \
logged AS (",
    history_insert!(),
    "SELECT b_id, h_attempt, h_outcome, h_code, h_sha, h_transcript, h_reason, h_worker, \
  h_observed, h_route, h_retry_after, NULL, NULL, b_rail FROM changed ORDER BY b_item), \
announced AS (SELECT pg_notify($27, '') FROM (SELECT 1 FROM changed WHERE b_wakes LIMIT 1) AS woken) \
SELECT b_item FROM changed UNION ALL SELECT 0 FROM announced"
);

/// Apply one write with the statement of a round; whether its guard matched.
pub(super) async fn write_one(conn: &mut PgConnection, write: Write) -> StoreResult<bool> {
    Ok(write_round(conn, &[write]).await?.first() == Some(&true))
}

/// Apply a round of writes (distinct receipts, in id order) in one
/// statement; which of them matched their guard, by position.
pub(super) async fn write_round(
    conn: &mut PgConnection,
    writes: &[Write],
) -> StoreResult<Vec<bool>> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    macro_rules! column {
        ($($field:tt)+) => {
            writes.iter().map(|w| w.$($field)+.clone()).collect::<Vec<_>>()
        };
    }
    let matched: Vec<i64> = sqlx::query_scalar(WRITE_ROUND)
        .bind(column!(guard.receipt_id))
        .bind(column!(guard.finalized_at))
        .bind(column!(guard.attempts))
        .bind(column!(guard.row_version))
        .bind(column!(guard.lease_owner))
        .bind(column!(guard.lease_token))
        .bind(column!(guard.lease_until_ms))
        .bind(column!(guard.now))
        .bind(
            writes
                .iter()
                .map(|w| w.values.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(column!(values.attempts))
        .bind(column!(values.next_visible_at_ms))
        .bind(column!(values.failure_code))
        .bind(column!(values.failure_sha256))
        .bind(column!(values.transcript_id))
        .bind(column!(values.skip_reason))
        .bind(column!(values.finished_at_ms))
        .bind(column!(history.attempt))
        .bind(column!(history.outcome))
        .bind(column!(history.code))
        .bind(column!(history.detail_sha256))
        .bind(column!(history.transcript_id))
        .bind(column!(history.reason))
        .bind(column!(history.worker_id))
        .bind(column!(history.observed_at_ms))
        .bind(column!(history.route))
        .bind(column!(wakes))
        .bind(CHANNEL)
        .bind(column!(history.retry_after_ms))
        // One column for the row's and the entry's rail code: they are the
        // same wherever a failure is written, and absent elsewhere.
        .bind(column!(history.rail_code))
        .fetch_all(conn)
        .await?;
    Ok(positions(writes.len(), matched))
}

/// One lease extension: the guard and the new deadline.
#[derive(Debug, Clone)]
pub(super) struct Extension {
    pub guard: Guard,
    pub until: i64,
}

const EXTEND_ROUND: &str = concat!(
    "WITH batch AS (SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], \
       $5::text[], $6::text[], $7::int8[], $8::int8[], $9::int8[]) WITH ORDINALITY \
       AS b (b_id, b_fin, b_attempts, b_version, b_owner, b_token, b_until, b_now, b_new_until, b_item)) \
     UPDATE receipts SET lease_until_ms = b_new_until FROM batch WHERE ",
    batch_cas!(),
    " RETURNING b_item, ",
    pg_receipt_columns!()
);

#[derive(sqlx::FromRow)]
struct Extended {
    b_item: i64,
    #[sqlx(flatten)]
    row: ReceiptRow,
}

/// Apply a round of extensions (distinct receipts, in id order) in one statement; the
/// extended row of each that matched, by position.
pub(super) async fn extend_round(
    conn: &mut PgConnection,
    extensions: &[Extension],
) -> StoreResult<Vec<Option<ReceiptRow>>> {
    let mut out = vec![None; extensions.len()];
    if extensions.is_empty() {
        return Ok(out);
    }
    macro_rules! column {
        ($($field:tt)+) => {
            extensions.iter().map(|e| e.$($field)+.clone()).collect::<Vec<_>>()
        };
    }
    let rows: Vec<Extended> = sqlx::query_as(EXTEND_ROUND)
        .bind(column!(guard.receipt_id))
        .bind(column!(guard.finalized_at))
        .bind(column!(guard.attempts))
        .bind(column!(guard.row_version))
        .bind(column!(guard.lease_owner))
        .bind(column!(guard.lease_token))
        .bind(column!(guard.lease_until_ms))
        .bind(column!(guard.now))
        .bind(column!(until))
        .fetch_all(conn)
        .await?;
    for extended in rows {
        let slot = usize::try_from(extended.b_item - 1)
            .ok()
            .and_then(|i| out.get_mut(i))
            .ok_or_else(|| StoreError::internal("extension answered an unknown item"))?;
        *slot = Some(extended.row);
    }
    Ok(out)
}

/// The current rows of `ids`, in one read, by id.
pub(super) async fn rows_of(
    conn: &mut PgConnection,
    ids: &[&str],
) -> StoreResult<std::collections::HashMap<String, ReceiptRow>> {
    if ids.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    let rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
        "SELECT ",
        pg_receipt_columns!(),
        " FROM receipts WHERE receipt_id = ANY($1::text[])"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.receipt_id.clone(), r))
        .collect())
}

/// 1-based ordinals returned by a statement, as a match flag per position.
fn positions(len: usize, matched: Vec<i64>) -> Vec<bool> {
    let mut out = vec![false; len];
    for item in matched {
        if let Some(slot) = usize::try_from(item - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_become_match_flags() {
        assert_eq!(positions(3, vec![3, 1]), vec![true, false, true]);
    }
}
