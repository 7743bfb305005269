//! One receipt by its key: its row (as of the latest commit, or locked for
//! the transaction) and its history.

use sqlx::PgConnection;

use super::super::rows::{HistoryRow, ReceiptRow};
use crate::store::StoreResult;

/// The receipt row, as of the latest commit.
pub(super) async fn row(
    conn: &mut PgConnection,
    receipt_id: &str,
) -> StoreResult<Option<ReceiptRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        pg_receipt_columns!(),
        " FROM receipts WHERE receipt_id = $1"
    ))
    .bind(receipt_id)
    .fetch_optional(conn)
    .await?)
}

/// The receipt row, locked until the transaction ends.
pub(super) async fn row_for_update(
    conn: &mut PgConnection,
    receipt_id: &str,
) -> StoreResult<Option<ReceiptRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        pg_receipt_columns!(),
        " FROM receipts WHERE receipt_id = $1 FOR UPDATE"
    ))
    .bind(receipt_id)
    .fetch_optional(conn)
    .await?)
}

/// The receipt's history, oldest entry first.
pub(super) async fn history(
    conn: &mut PgConnection,
    receipt_id: &str,
) -> StoreResult<Vec<HistoryRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        crate::store::rows::history_columns!(),
        " FROM receipt_history WHERE receipt_id = $1 ORDER BY id"
    ))
    .bind(receipt_id)
    .fetch_all(conn)
    .await?)
}
