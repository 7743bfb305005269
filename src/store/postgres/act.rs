//! Operator actions (redrive, cancel, …): each judged on its row, then one
//! update and one history insert for the rows changed; work made due is
//! announced to every replica on commit.

use std::collections::HashMap;

use sqlx::PgConnection;

use super::super::actions::{self, Binds};
use super::super::rules::{NewHistory, history_insert};
use super::{PostgresStore, Tx, announce, finish};
use crate::domain::{ReceiptId, UnixMs};
use crate::store::rows::ReceiptRow;
use crate::store::{Acted, ActionResult, OperatorAction, StoreResult};

/// Every named row, read in one statement; when `lock`, locked until the
/// transaction ends, in id order (byte order, as every writer here locks),
/// so that two actions over the same receipts, in whatever order they name
/// them, wait for each other instead of deadlocking.
async fn rows_of(
    tx: &mut Tx,
    ids: &[&str],
    lock: bool,
) -> Result<HashMap<String, ReceiptRow>, sqlx::Error> {
    let sql = if lock {
        concat!(
            "SELECT ",
            pg_receipt_columns!(),
            " FROM receipts WHERE receipt_id = ANY($1::text[]) \
             ORDER BY receipt_id COLLATE \"C\" FOR UPDATE"
        )
    } else {
        concat!(
            "SELECT ",
            pg_receipt_columns!(),
            " FROM receipts WHERE receipt_id = ANY($1::text[])"
        )
    };
    let rows: Vec<ReceiptRow> = sqlx::query_as(sql).bind(ids).fetch_all(&mut **tx).await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.receipt_id.clone(), r))
        .collect())
}

/// Do an operator's action to each receipt, each judged on its own row (a
/// receipt named twice as the first naming left it), in a constant number
/// of statements: one read that locks every row, one update of the rows
/// changed and one insert of their history entries. In a dry run, judge only.
async fn act_all(
    tx: &mut Tx,
    action: &OperatorAction,
    ids: &[ReceiptId],
    actor: Option<&str>,
    now: i64,
    dry_run: bool,
) -> Result<Vec<ActionResult>, sqlx::Error> {
    let named: Vec<&str> = ids.iter().map(ReceiptId::as_str).collect();
    let mut rows = rows_of(tx, &named, !dry_run).await?;
    let mut results = Vec::with_capacity(ids.len());
    let mut changed: Vec<(&str, NewHistory)> = Vec::new();
    for id in &named {
        let row = rows.get_mut(*id);
        let result = actions::judge(action, row.as_deref(), now);
        if let (Ok(Acted::Done), Some(row)) = (result, row) {
            changed.push((id, actions::entry(action, row, actor, now)));
            actions::apply(action, row, now);
        }
        results.push(result);
    }
    if dry_run || changed.is_empty() {
        return Ok(results);
    }
    // Each receipt is changed at most once (see `actions::apply`), so the
    // ids changed are distinct.
    let changed_ids: Vec<&str> = changed.iter().map(|(id, _)| *id).collect();
    let sql = actions::update_many_sql(action);
    let query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str())).bind(&changed_ids);
    let query = match action.binds() {
        Binds::Id => query,
        Binds::Now => query.bind(now),
        Binds::NowReason(reason) => query.bind(now).bind(reason),
    };
    // The rows are locked: nothing can have moved them since they were judged.
    if query.execute(&mut **tx).await?.rows_affected() != changed_ids.len() as u64 {
        return Err(sqlx::Error::RowNotFound);
    }
    append_history(tx, &changed).await?;
    if action.may_make_due() {
        // Their groups may have been forgotten while they had nothing active
        // (src/store/postgres/idle_groups.rs: this waits for a sweep's page).
        sqlx::query(
            "INSERT INTO receipt_groups (name) SELECT DISTINCT receipt_group FROM receipts \
             WHERE receipt_id = ANY($1::text[]) AND receipt_group <> 'default' \
             ORDER BY receipt_group ON CONFLICT (name) DO NOTHING",
        )
        .bind(&changed_ids)
        .execute(&mut **tx)
        .await?;
        announce(tx).await?;
    }
    Ok(results)
}

/// Insert operators' history entries, in the order given, in one statement.
async fn append_history(
    conn: &mut PgConnection,
    entries: &[(&str, NewHistory)],
) -> Result<(), sqlx::Error> {
    macro_rules! column {
        ($field:ident) => {
            entries
                .iter()
                .map(|(_, h)| h.$field.clone())
                .collect::<Vec<_>>()
        };
    }
    let ids: Vec<&str> = entries.iter().map(|(id, _)| *id).collect();
    sqlx::query(concat!(
        history_insert!(),
        "SELECT id, attempt, outcome, code, sha, transcript, reason, worker, observed, route, \
               retry_after, actor, note, NULL FROM unnest($1::text[], $2::int8[], $3::text[], \
               $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int8[], \
               $10::text[], $13::int8[], $11::text[], $12::text[]) \
             WITH ORDINALITY AS h (id, attempt, outcome, code, sha, transcript, reason, worker, \
               observed, route, retry_after, actor, note, n) ORDER BY n"
    ))
    .bind(ids)
    .bind(column!(attempt))
    .bind(column!(outcome))
    .bind(column!(code))
    .bind(column!(detail_sha256))
    .bind(column!(transcript_id))
    .bind(column!(reason))
    .bind(column!(worker_id))
    .bind(column!(observed_at_ms))
    .bind(column!(route))
    .bind(column!(actor))
    .bind(column!(note))
    .bind(column!(retry_after_ms))
    .execute(conn)
    .await?;
    Ok(())
}

/// A failure worth trying the whole transaction again for: a deadlock or a
/// serialization failure (PostgreSQL aborted the transaction; nothing of it
/// is kept).
fn transient(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .is_some_and(|code| code == "40P01" || code == "40001")
}

/// Tries of one operator action's transaction.
const ACT_TRIES: u32 = 3;

impl PostgresStore {
    pub(super) async fn act_on(
        &self,
        action: &OperatorAction,
        ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        let now = now_ms.as_i64();
        let mut tried = 0;
        let results = loop {
            tried += 1;
            let mut tx = self.begin().await?;
            match act_all(&mut tx, action, ids, actor, now, dry_run).await {
                Ok(results) => break finish(tx, Ok(results)).await?,
                Err(e) if transient(&e) && tried < ACT_TRIES => {
                    let _ = tx.rollback().await;
                    tracing::warn!(error = %e, tried, "operator action: the database aborted \
                        the transaction; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(10 * u64::from(tried)))
                        .await;
                }
                Err(e) => return finish(tx, Err(e.into())).await,
            }
        };
        if action.may_make_due() && !dry_run && results.contains(&Ok(Acted::Done)) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }
}
