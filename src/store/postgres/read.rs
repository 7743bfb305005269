//! Reads: a receipt's view, dead-letter pages and the status summary, each
//! from one consistent snapshot, with the same SQL shape as the SQLite store.

use super::super::rows::to_i64;
use super::{PostgresStore, history, row};
use crate::domain::{ReceiptId, StoreError, UnixMs};
use crate::store::rows::ReceiptRow;
use crate::store::rules::{lapsed_sql, unleased_sql};
use crate::store::{
    DeadLetter, DeadLetterCursor, ReceiptState, ReceiptView, StatusView, StoreResult, status,
};

impl PostgresStore {
    pub(super) async fn dead_letter_of(
        &self,
        receipt_id: &ReceiptId,
    ) -> StoreResult<Option<DeadLetter>> {
        let found = self
            .read(|| async { row(&mut *self.pool.acquire().await?, receipt_id.as_str()).await })
            .await?;
        found.map_or(Ok(None), |r| r.dead_letter())
    }

    pub(super) async fn read_view(
        &self,
        receipt_id: &str,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        let now = now_ms.as_i64();
        let mut tx = self.begin_read().await?;
        let Some(row) = row(&mut tx, receipt_id).await? else {
            return Ok(None);
        };
        let history = history(&mut tx, receipt_id).await?;
        tx.commit().await?;
        row.view(now, history).map(Some)
    }

    pub(super) async fn dead_letter_page(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        let (after_at, after_id) = match after {
            // Stored ids hold no NUL, so every id above `p\0…` is also above `p`
            // and none equals it: cutting the cursor at its first NUL pages alike.
            Some((at, id)) => (
                to_i64(at, "cursor")?,
                id.split('\0').next().unwrap_or_default().to_owned(),
            ),
            None => (-1, String::new()),
        };
        let rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
            "SELECT ",
            pg_receipt_columns!(),
            " FROM receipts WHERE status = 'dead_lettered' AND status <> 'active' \
              AND (finalized_at, receipt_id) > ($1, $2) \
              ORDER BY finalized_at, receipt_id LIMIT $3"
        ))
        .bind(after_at)
        .bind(after_id)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .filter_map(|r| r.dead_letter().transpose())
            .collect()
    }

    /// Counts, oldest due time and samples from one snapshot, without a
    /// scan: the counter slots kept by triggers
    /// (migrations/postgres/0004_counts.sql) plus the live leases, each
    /// sample a range of its own partial index. Two statements, where one
    /// per figure and per state took eleven round trips
    /// (docs/perf-log/groups-and-status.md, "`/v1/status` at 10 M receipts").
    pub(super) async fn status_view(
        &self,
        now_ms: UnixMs,
        limit: usize,
    ) -> StoreResult<StatusView> {
        let now = now_ms.as_i64();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut tx = self.begin_read().await?;
        let figures: Figures = sqlx::query_as(FIGURES)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
        let sampled: Vec<(String, String, i64, i64)> = sqlx::query_as(SAMPLES)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let (
            fresh,
            retried,
            settled,
            skipped,
            dead,
            canceled,
            live,
            live_fresh,
            scheduled,
            held,
            oldest,
        ) = figures;
        let mut samples: Vec<(ReceiptState, Vec<status::SampleRow>)> = ReceiptState::ALL
            .into_iter()
            .map(|s| (s, Vec::new()))
            .collect();
        for (state, receipt_id, finalized_at, attempts) in sampled {
            let slot = samples
                .iter_mut()
                .find(|(s, _)| s.as_str() == state)
                .ok_or_else(|| StoreError::invalid_record("sampled state"))?;
            slot.1.push((receipt_id, finalized_at, attempts));
        }
        status::build_status(
            now,
            status::state_counts(
                (fresh, retried, settled, skipped, dead, canceled),
                (live, live_fresh),
            )?,
            scheduled,
            held,
            oldest,
            samples,
        )
    }
}

/// The six buckets, the live leases (all, on fresh rows), the scheduled
/// and held counts and the oldest due time.
type Figures = (
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
);

/// Every figure of the status in one row, `$1` now. The scheduled count is a
/// range of receipts_scheduled (migrations/postgres/0005_scheduled.sql), whose
/// predicate it repeats so that the planner can use it. Due rows either hold
/// no lease or an expired one; `attempts >= 0` names `receipts_waiting`
/// (migrations/postgres/0014_unleased_due.sql). The held count is a range of
/// receipts_held (migrations/postgres/0019_rail_codes_and_held.sql).
const FIGURES: &str = concat!(
    "SELECT c.*, l.*, \
     (SELECT COUNT(*) FROM receipts WHERE status = 'active' AND attempts = 0 \
       AND next_visible_at_ms > created_at_ms AND next_visible_at_ms > $1), \
     (SELECT COUNT(*) FROM receipts WHERE status = 'active' AND held_at_ms IS NOT NULL), \
     LEAST((SELECT MIN(next_visible_at_ms) FROM receipts WHERE ",
    unleased_sql!(),
    " AND attempts >= 0 AND next_visible_at_ms <= $1), \
         (SELECT MIN(next_visible_at_ms) FROM receipts WHERE ",
    lapsed_sql!("$1"),
    " AND next_visible_at_ms <= $1)) \
     FROM (SELECT COALESCE(SUM(fresh), 0)::int8, COALESCE(SUM(retried), 0)::int8, \
       COALESCE(SUM(settled), 0)::int8, COALESCE(SUM(skipped), 0)::int8, \
       COALESCE(SUM(dead_lettered), 0)::int8, COALESCE(SUM(canceled), 0)::int8 \
       FROM receipt_counts) AS c, \
     (SELECT COUNT(*), COUNT(*) FILTER (WHERE attempts = 0) FROM receipts \
       WHERE lease_until_ms > $1) AS l"
);

/// One finished state's sample branch of [`SAMPLES`]: `receipts_by_status`
/// holds only finished rows, hence the second condition.
macro_rules! finished_sample {
    ($state:literal) => {
        concat!(
            " UNION ALL (SELECT '",
            $state,
            "', receipt_id, finalized_at, attempts FROM receipts \
             WHERE status = '",
            $state,
            "' AND status <> 'active' ORDER BY finalized_at, receipt_id LIMIT $2)"
        )
    };
}

/// One waiting state's sample branch of [`SAMPLES`]: its rows without a
/// lease (`receipts_fresh` or `receipts_retried`, which hold no leased row:
/// migrations/postgres/0018_fresh_without_leases.sql) merged with its
/// lapsed leases (`receipts_leases`, bounded by the leases handed out).
macro_rules! waiting_sample {
    ($state:literal, $attempts:literal) => {
        concat!(
            "(SELECT '",
            $state,
            "', receipt_id, finalized_at, attempts FROM (\
             (SELECT receipt_id, finalized_at, attempts FROM receipts \
               WHERE status = 'active' AND attempts ",
            $attempts,
            " AND lease_token IS NULL ORDER BY finalized_at, receipt_id LIMIT $2) \
             UNION ALL (SELECT receipt_id, finalized_at, attempts FROM receipts \
               WHERE lease_until_ms <= $1 AND attempts ",
            $attempts,
            " ORDER BY finalized_at, receipt_id LIMIT $2)) AS w \
             ORDER BY finalized_at, receipt_id LIMIT $2)"
        )
    };
}

/// Each state's first `$2` receipts in `(finalized_at, receipt_id)` order,
/// labelled with the state, `$1` now: ranges of the state's own partial
/// indexes (migrations/postgres/0004_counts.sql), each stopping at `$2`.
const SAMPLES: &str = concat!(
    waiting_sample!("pending", "= 0"),
    " UNION ALL (SELECT 'leased', receipt_id, finalized_at, attempts FROM receipts \
       WHERE lease_until_ms > $1 ORDER BY finalized_at, receipt_id LIMIT $2) UNION ALL ",
    waiting_sample!("retry_scheduled", "> 0"),
    finished_sample!("settled"),
    finished_sample!("skipped"),
    finished_sample!("dead_lettered"),
    finished_sample!("canceled"),
);
