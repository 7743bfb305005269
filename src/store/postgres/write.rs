//! Enqueue and redrive: the writes that make work due, announced to every
//! replica on commit.

use super::super::rows::to_i64;
use super::super::rules::NewHistory;
use super::*;

async fn enqueue_all(tx: &mut Tx, receipts: &[NewReceipt], now: i64) -> StoreResult<Vec<Enqueued>> {
    let mut values = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        let finalized_at = to_i64(receipt.finalized_at, "finalized_at")?;
        let visible = receipt
            .visible_at_ms
            .map_or(Ok(now), |v| to_i64(v, "visible_at_ms"))?;
        let observation = receipt
            .observation
            .as_ref()
            .map(serde_json::Value::to_string);
        values.push((finalized_at, visible, observation));
    }
    let mut results = vec![Enqueued::Existing; receipts.len()];
    for i in in_id_order(receipts, |r| r.receipt_id.as_str()) {
        let (receipt, (finalized_at, visible, observation)) = (&receipts[i], &values[i]);
        let inserted = sqlx::query(
            "INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
             row_version, next_visible_at_ms, created_at_ms) VALUES ($1, $2, $3, 'active', 0, 0, $4, $5) \
             ON CONFLICT (receipt_id) DO NOTHING",
        )
        .bind(receipt.receipt_id.as_str())
        .bind(finalized_at)
        .bind(observation)
        .bind(visible)
        .bind(now)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        results[i] = if inserted == 1 {
            Enqueued::Created
        } else {
            let existing = row(tx, receipt.receipt_id.as_str())
                .await?
                .ok_or_else(|| SettlementRouteError::backend("receipt vanished during enqueue"))?;
            rules::same_identity(&existing, receipt)?
        };
    }
    if results.contains(&Enqueued::Created) {
        announce(tx).await?;
    }
    Ok(results)
}

async fn redrive(tx: &mut Tx, receipt_id: &str, now: i64) -> StoreResult<Option<ReceiptView>> {
    let Some(found) = row_for_update(tx, receipt_id).await? else {
        return Ok(None);
    };
    let Some(letter) = found.dead_letter()? else {
        return Ok(None);
    };
    sqlx::query(
        "UPDATE receipts SET status = 'active', attempts = 0, next_visible_at_ms = $2, \
         finished_at_ms = NULL WHERE receipt_id = $1 AND status = 'dead_lettered'",
    )
    .bind(receipt_id)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    append_history(tx, receipt_id, &rules::redrive_entry(&letter, now)).await?;
    let redriven = row(tx, receipt_id)
        .await?
        .ok_or_else(|| SettlementRouteError::backend("receipt vanished during redrive"))?;
    let view = redriven.view(now, history(tx, receipt_id).await?)?;
    announce(tx).await?;
    Ok(Some(view))
}

async fn append_history(
    conn: &mut PgConnection,
    receipt_id: &str,
    h: &NewHistory,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
         transcript_id, reason, worker_id, observed_at_ms, route) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(receipt_id)
    .bind(h.attempt)
    .bind(h.outcome)
    .bind(h.code)
    .bind(&h.detail_sha256)
    .bind(&h.transcript_id)
    .bind(h.reason)
    .bind(&h.worker_id)
    .bind(h.observed_at_ms)
    .bind(h.route)
    .execute(conn)
    .await?;
    Ok(())
}

impl PostgresStore {
    pub(super) async fn enqueue_receipts(
        &self,
        receipts: &[NewReceipt],
        now_ms: u64,
    ) -> StoreResult<Vec<Enqueued>> {
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let result = enqueue_all(&mut tx, receipts, now).await;
        let results = finish(tx, result).await?;
        if results.contains(&Enqueued::Created) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    pub(super) async fn redrive_receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: u64,
    ) -> StoreResult<Option<ReceiptView>> {
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let result = redrive(&mut tx, receipt_id.as_str(), now).await;
        let view = finish(tx, result).await?;
        if view.is_some() {
            self.notify.notify_waiters();
        }
        Ok(view)
    }
}
