//! Enqueue: new receipts in one statement, the new work announced to every
//! replica on commit.

use std::collections::{HashMap, HashSet};

use super::super::rows::to_i64;
use super::{CHANNEL, PostgresStore, Tx, finish};
use crate::domain::{StoreError, UnixMs};
use crate::store::rows::ReceiptRow;
use crate::store::{Enqueued, NewReceipt, StoreResult, rules};

/// Insert every new receipt in one statement, in id order (so that two
/// batches that share ids wait for each other instead of deadlocking) and,
/// among repeats of an id, in batch order (so that the first one creates it).
/// The statement announces the new work itself when it created any (a `NULL`
/// row stands for the announcement), saving a round trip.
const ENQUEUE: &str = "\
WITH created AS (INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
  row_version, next_visible_at_ms, created_at_ms, receipt_group, priority, traceparent, \
  tracestate) \
  SELECT id, fin, obs::json, 'active', 0, 0, visible, $5, grp, prio, tparent, tstate \
  FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $7::text[], $8::int2[], \
    $9::text[], $10::text[]) \
    WITH ORDINALITY AS b (id, fin, obs, visible, grp, prio, tparent, tstate, n) \
  ORDER BY id COLLATE \"C\", n \
  ON CONFLICT (receipt_id) DO NOTHING RETURNING receipt_id, receipt_group), \
registered AS (INSERT INTO receipt_groups (name) \
  SELECT DISTINCT receipt_group FROM created WHERE receipt_group <> 'default' \
  ORDER BY receipt_group ON CONFLICT (name) DO NOTHING), \
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
    let mut groups = Vec::with_capacity(receipts.len());
    let mut priorities = Vec::with_capacity(receipts.len());
    let mut traceparents = Vec::with_capacity(receipts.len());
    let mut tracestates = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        traceparents.push(receipt.trace.as_ref().map(|t| t.traceparent()));
        tracestates.push(receipt.trace.as_ref().and_then(|t| t.tracestate()));
        ids.push(receipt.receipt_id.as_str());
        groups.push(receipt.group.as_str());
        priorities.push(receipt.priority.stored());
        finalized.push(to_i64(receipt.finalized_at, "finalized_at")?);
        visible.push(receipt.visible_at_ms.map_or(now, UnixMs::as_i64));
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
        .bind(&groups)
        .bind(&priorities)
        .bind(&traceparents)
        .bind(&tracestates)
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
            .ok_or_else(|| StoreError::internal("receipt vanished during enqueue"))?;
        results.push(rules::same_identity(stored, receipt)?);
    }
    Ok(results)
}
impl PostgresStore {
    pub(super) async fn enqueue_receipts(
        &self,
        receipts: &[NewReceipt],
        now_ms: UnixMs,
    ) -> StoreResult<Vec<Enqueued>> {
        let now = now_ms.as_i64();
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
}
