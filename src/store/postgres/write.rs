//! Enqueue and redrive: the writes that make work due, announced to every
//! replica on commit.

use std::collections::{HashMap, HashSet};

use super::super::rows::to_i64;
use super::super::rules::NewHistory;
use super::*;

/// Insert every new receipt in one statement, in id order (so that two
/// batches that share ids wait for each other instead of deadlocking) and,
/// among repeats of an id, in batch order (so that the first one creates it).
/// The statement announces the new work itself when it created any (a `NULL`
/// row stands for the announcement), saving a round trip.
const ENQUEUE: &str = "\
WITH created AS (INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
  row_version, next_visible_at_ms, created_at_ms) \
  SELECT id, fin, obs::json, 'active', 0, 0, visible, $5 \
  FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[]) WITH ORDINALITY AS b (id, fin, obs, visible, n) \
  ORDER BY id COLLATE \"C\", n \
  ON CONFLICT (receipt_id) DO NOTHING RETURNING receipt_id), \
announced AS (SELECT pg_notify($6, '') FROM (SELECT 1 FROM created LIMIT 1) AS any_created) \
SELECT receipt_id FROM created UNION ALL SELECT NULL FROM announced";

/// Store receipts; each is judged on its own. One statement when every id
/// is new; one more read of the rows that existed otherwise, whose identity
/// is then compared in Rust.
async fn enqueue_all(tx: &mut Tx, receipts: &[NewReceipt], now: i64) -> StoreResult<Vec<Enqueued>> {
    let mut ids = Vec::with_capacity(receipts.len());
    let mut finalized = Vec::with_capacity(receipts.len());
    let mut observations = Vec::with_capacity(receipts.len());
    let mut visible = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        ids.push(receipt.receipt_id.as_str());
        finalized.push(to_i64(receipt.finalized_at, "finalized_at")?);
        visible.push(
            receipt
                .visible_at_ms
                .map_or(Ok(now), |v| to_i64(v, "visible_at_ms"))?,
        );
        // The observation travels and is stored as its exact JSON text.
        observations.push(
            receipt
                .observation
                .as_ref()
                .map(serde_json::Value::to_string),
        );
    }
    let created: Vec<Option<String>> = sqlx::query_scalar(ENQUEUE)
        .bind(&ids)
        .bind(finalized)
        .bind(observations)
        .bind(visible)
        .bind(now)
        .bind(CHANNEL)
        .fetch_all(&mut **tx)
        .await?;
    let mut created: HashSet<String> = created.into_iter().flatten().collect();
    let mut results = Vec::with_capacity(receipts.len());
    let mut existing: Option<HashMap<String, ReceiptRow>> = None;
    for receipt in receipts {
        let id = receipt.receipt_id.as_str();
        // The first occurrence of a new id created it; a repeat in the same
        // batch is compared with what the first one stored.
        if created.remove(id) {
            results.push(Enqueued::Created);
            continue;
        }
        if existing.is_none() {
            let known: Vec<ReceiptRow> = sqlx::query_as(concat!(
                "SELECT ",
                pg_receipt_columns!(),
                " FROM receipts WHERE receipt_id = ANY($1::text[])"
            ))
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await?;
            existing = Some(
                known
                    .into_iter()
                    .map(|r| (r.receipt_id.clone(), r))
                    .collect(),
            );
        }
        let stored = existing
            .as_ref()
            .and_then(|rows| rows.get(id))
            .ok_or_else(|| SettlementRouteError::backend("receipt vanished during enqueue"))?;
        results.push(rules::same_identity(stored, receipt)?);
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
        if receipts.is_empty() {
            return Ok(Vec::new());
        }
        // A transaction, although the insert is one statement: a later
        // refusal (a stored identity that does not decode) must undo it.
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
