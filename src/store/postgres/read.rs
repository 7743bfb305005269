//! Reads: a receipt's view, dead-letter pages and the status summary, each
//! from one consistent snapshot, with the same SQL shape as the SQLite store.

use super::super::rows::to_i64;
use super::*;

/// The state a row reports at `$1`, in SQL.
macro_rules! state_case {
    () => {
        "(CASE WHEN status <> 'active' THEN status WHEN lease_until_ms > $1 THEN 'leased' \
          WHEN attempts = 0 THEN 'pending' ELSE 'retry_scheduled' END)"
    };
}

impl PostgresStore {
    pub(super) async fn read_view(
        &self,
        receipt_id: &str,
        now_ms: u64,
    ) -> StoreResult<Option<ReceiptView>> {
        let now = to_i64(now_ms, "now_ms")?;
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
            " FROM receipts WHERE status = 'dead_lettered' AND (finalized_at, receipt_id) > ($1, $2) \
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

    pub(super) async fn status_view(&self, now_ms: u64, limit: usize) -> StoreResult<StatusView> {
        let now = to_i64(now_ms, "now_ms")?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut tx = self.begin_read().await?;
        let counted: Vec<(String, i64)> = sqlx::query_as(concat!(
            "SELECT ",
            state_case!(),
            " AS st, COUNT(*) FROM receipts GROUP BY st"
        ))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(next_visible_at_ms) FROM receipts WHERE status = 'active' \
             AND next_visible_at_ms <= $1 AND (lease_until_ms IS NULL OR lease_until_ms <= $1)",
        )
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let mut samples = Vec::new();
        for state in ReceiptState::ALL {
            let rows: Vec<(String, i64, i64)> = sqlx::query_as(concat!(
                "SELECT receipt_id, finalized_at, attempts FROM receipts WHERE ",
                state_case!(),
                " = $2 ORDER BY finalized_at, receipt_id LIMIT $3"
            ))
            .bind(now)
            .bind(state.as_str())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
            samples.push((state, rows));
        }
        tx.commit().await?;
        rules::build_status(now, counted, oldest, samples)
    }
}
