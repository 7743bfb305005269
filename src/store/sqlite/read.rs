//! Reads, on the reader pool (WAL readers never wait for the writer).

use sqlx::{SqliteConnection, SqlitePool};

use super::super::rows::{HistoryRow, ReceiptRow, to_i64};
use super::super::status;
use crate::store::rows::{history_columns, receipt_columns};
use crate::store::rules::{lapsed_sql, unleased_sql};
use crate::store::{
    DeadLetter, DeadLetterCursor, ReceiptState, ReceiptView, StatusView, StoreResult,
};

/// One receipt row.
pub async fn row(conn: &mut SqliteConnection, receipt_id: &str) -> StoreResult<Option<ReceiptRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM receipts WHERE receipt_id = ?1"
    ))
    .bind(receipt_id)
    .fetch_optional(conn)
    .await?)
}

/// A receipt's history, oldest first.
pub async fn history(
    conn: &mut SqliteConnection,
    receipt_id: &str,
) -> StoreResult<Vec<HistoryRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        history_columns!(),
        " FROM receipt_history WHERE receipt_id = ?1 ORDER BY id"
    ))
    .bind(receipt_id)
    .fetch_all(conn)
    .await?)
}

/// A receipt and its history from one snapshot.
pub async fn view(
    pool: &SqlitePool,
    receipt_id: &str,
    now: i64,
) -> StoreResult<Option<ReceiptView>> {
    let mut tx = pool.begin().await?;
    let Some(found) = row(&mut tx, receipt_id).await? else {
        return Ok(None);
    };
    let entries = history(&mut tx, receipt_id).await?;
    tx.commit().await?;
    found.view(now, entries).map(Some)
}

/// A page of dead letters after `after`.
pub async fn dead_letters(
    pool: &SqlitePool,
    limit: usize,
    after: Option<DeadLetterCursor>,
) -> StoreResult<Vec<DeadLetter>> {
    let (after_at, after_id) = match after {
        Some((at, id)) => (to_i64(at, "cursor")?, id),
        None => (-1, String::new()),
    };
    let rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM receipts WHERE status = 'dead_lettered' AND status <> 'active' \
          AND (finalized_at, receipt_id) > (?1, ?2) ORDER BY finalized_at, receipt_id LIMIT ?3"
    ))
    .bind(after_at)
    .bind(after_id)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .filter_map(|r| r.dead_letter().transpose())
        .collect()
}

/// Counts, oldest due time and samples, from one snapshot, without a scan:
/// counters kept by triggers (migrations/sqlite/0004_counts.sql) plus the
/// live leases, each sample a range of its own partial index.
pub async fn status(pool: &SqlitePool, now: i64, limit: usize) -> StoreResult<StatusView> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut tx = pool.begin().await?;
    let sums: status::Buckets = sqlx::query_as(
        "SELECT fresh, retried, settled, skipped, dead_lettered, canceled FROM receipt_counts \
         WHERE id = 1",
    )
    .fetch_one(&mut *tx)
    .await?;
    let live: (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(SUM(attempts = 0), 0) FROM receipts \
         WHERE lease_until_ms > ?1",
    )
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    let scheduled: i64 = sqlx::query_scalar(SCHEDULED)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
    // A range of `receipts_held` (migrations/sqlite/0017_rail_codes_and_held.sql).
    let held: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM receipts INDEXED BY receipts_held \
         WHERE status = 'active' AND held_at_ms IS NOT NULL",
    )
    .fetch_one(&mut *tx)
    .await?;
    // Due rows either hold no lease or an expired one.
    let oldest: Option<i64> = sqlx::query_scalar(concat!(
        "SELECT MIN(t) FROM (SELECT MIN(next_visible_at_ms) AS t FROM receipts WHERE ",
        unleased_sql!(),
        " AND next_visible_at_ms <= ?1 \
             UNION ALL SELECT MIN(next_visible_at_ms) FROM receipts WHERE ",
        lapsed_sql!("?1"),
        " AND next_visible_at_ms <= ?1)"
    ))
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    let mut samples = Vec::new();
    for state in ReceiptState::ALL {
        let sql = match state {
            ReceiptState::Pending => concat!(
                "SELECT receipt_id, finalized_at, attempts FROM receipts INDEXED BY receipts_fresh \
                 WHERE status = 'active' AND attempts = 0 ",
                "AND (lease_until_ms IS NULL OR lease_until_ms <= ?1) ",
                "ORDER BY finalized_at, receipt_id LIMIT ?2"
            ),
            ReceiptState::RetryScheduled => concat!(
                "SELECT receipt_id, finalized_at, attempts FROM receipts INDEXED BY receipts_retried \
                 WHERE status = 'active' AND attempts > 0 ",
                "AND (lease_until_ms IS NULL OR lease_until_ms <= ?1) ",
                "ORDER BY finalized_at, receipt_id LIMIT ?2"
            ),
            ReceiptState::Leased => {
                "SELECT receipt_id, finalized_at, attempts FROM receipts INDEXED BY receipts_leases \
                 WHERE lease_until_ms > ?1 \
                 ORDER BY finalized_at, receipt_id LIMIT ?2"
            }
            ReceiptState::Settled
            | ReceiptState::Skipped
            | ReceiptState::DeadLettered
            | ReceiptState::Canceled => {
                "SELECT receipt_id, finalized_at, attempts FROM receipts \
                 INDEXED BY receipts_by_status WHERE status = ?1 AND status <> 'active' \
                 ORDER BY finalized_at, receipt_id LIMIT ?2"
            }
        };
        let query = sqlx::query_as::<_, status::SampleRow>(sql);
        let query = match state {
            ReceiptState::Pending | ReceiptState::RetryScheduled | ReceiptState::Leased => {
                query.bind(now)
            }
            _ => query.bind(state.as_str()),
        };
        let rows = query.bind(limit).fetch_all(&mut *tx).await?;
        samples.push((state, rows));
    }
    tx.commit().await?;
    status::build_status(
        now,
        status::state_counts(sums, live)?,
        scheduled,
        held,
        oldest,
        samples,
    )
}

/// Receipts never attempted and not yet visible: a range of the index
/// `receipts_scheduled` (migrations/sqlite/0005_scheduled.sql), whose
/// predicate this repeats word for word so that SQLite can use it.
const SCHEDULED: &str = "SELECT COUNT(*) FROM receipts INDEXED BY receipts_scheduled \
     WHERE status = 'active' AND attempts = 0 AND next_visible_at_ms > created_at_ms \
     AND next_visible_at_ms > ?1";
