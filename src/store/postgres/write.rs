//! Enqueue and redrive: the writes that make work due, announced to every
//! replica on commit.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;

use super::super::actions::{self, Binds};
use super::super::rows::to_i64;
use super::super::rules::NewHistory;
use super::{CHANNEL, PostgresStore, Tx, announce, finish, row, row_for_update};
use crate::domain::{ReceiptId, StoreError};
use crate::store::rows::ReceiptRow;
use crate::store::{Acted, ActionResult, Enqueued, NewReceipt, OperatorAction, StoreResult, rules};

/// Insert every new receipt in one statement, in id order (so that two
/// batches that share ids wait for each other instead of deadlocking) and,
/// among repeats of an id, in batch order (so that the first one creates it).
/// The statement announces the new work itself when it created any (a `NULL`
/// row stands for the announcement), saving a round trip.
const ENQUEUE: &str = "\
WITH created AS (INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
  row_version, next_visible_at_ms, created_at_ms, receipt_group) \
  SELECT id, fin, obs::json, 'active', 0, 0, visible, $5, grp \
  FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $7::text[]) WITH ORDINALITY \
    AS b (id, fin, obs, visible, grp, n) \
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
    for receipt in receipts {
        ids.push(receipt.receipt_id.as_str());
        groups.push(receipt.group.as_str());
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
        .bind(&groups)
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
            .ok_or_else(|| StoreError::backend("receipt vanished during enqueue"))?;
        results.push(rules::same_identity(stored, receipt)?);
    }
    Ok(results)
}

/// Do an operator's action to each receipt in order, each judged on its own
/// row, locked until the transaction ends; in a dry run, judge only.
async fn act_all(
    tx: &mut Tx,
    action: &OperatorAction,
    ids: &[ReceiptId],
    actor: Option<&str>,
    now: i64,
    dry_run: bool,
) -> StoreResult<Vec<ActionResult>> {
    // The statement is one of `update_sql`'s constants with PostgreSQL's
    // placeholders: no value is ever spliced into it.
    let sql = actions::update_sql(action).replace('?', "$");
    let mut results = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.as_str();
        let found = if dry_run {
            row(tx, id).await?
        } else {
            row_for_update(tx, id).await?
        };
        let result = actions::judge(action, found.as_ref(), now);
        if let (Ok(Acted::Done), Some(found), false) = (result, &found, dry_run) {
            let query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str())).bind(id);
            let query = match action.binds() {
                Binds::Id => query,
                Binds::Now => query.bind(now),
                Binds::NowReason(reason) => query.bind(now).bind(reason),
            };
            // The row is locked: nothing can have moved it since it was judged.
            if query.execute(&mut **tx).await?.rows_affected() != 1 {
                return Err(StoreError::backend("operator action changed no row"));
            }
            append_history(tx, id, &actions::entry(action, found, actor, now)).await?;
        }
        results.push(result);
    }
    if action.may_make_due() && !dry_run && results.contains(&Ok(Acted::Done)) {
        announce(tx).await?;
    }
    Ok(results)
}

async fn append_history(
    conn: &mut PgConnection,
    receipt_id: &str,
    h: &NewHistory,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
         transcript_id, reason, worker_id, observed_at_ms, route, actor, note) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
    .bind(&h.actor)
    .bind(&h.note)
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

    pub(super) async fn act_on(
        &self,
        action: &OperatorAction,
        ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: u64,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let result = act_all(&mut tx, action, ids, actor, now, dry_run).await;
        let results = finish(tx, result).await?;
        if action.may_make_due() && !dry_run && results.contains(&Ok(Acted::Done)) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }
}
