//! Reads the writer needs inside its own transaction (rows to explain a
//! refusal, the rows a batch touched), on the synchronous writer connection.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

use super::super::rows::ReceiptRow;
use super::super::rules::{NewHistory, history_insert};
use crate::domain::StoreError;
use crate::store::rows::receipt_columns;
use crate::store::{Status, StoreResult};

/// A `ReceiptRow` from a row selected with `receipt_columns!()`.
pub fn receipt_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ReceiptRow> {
    Ok(ReceiptRow {
        receipt_id: r.get(0)?,
        finalized_at: r.get(1)?,
        observation: r.get(2)?,
        status: Status::try_from(r.get::<_, String>(3)?).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e))
        })?,
        attempts: r.get(4)?,
        row_version: r.get(5)?,
        next_visible_at_ms: r.get(6)?,
        lease_owner: r.get(7)?,
        lease_token: r.get(8)?,
        lease_until_ms: r.get(9)?,
        failure_code: r.get(10)?,
        failure_sha256: r.get(11)?,
        transcript_id: r.get(12)?,
        skip_reason: r.get(13)?,
        finished_at_ms: r.get(14)?,
        held_at_ms: r.get(15)?,
        cancel_reason: r.get(16)?,
        receipt_group: r.get(17)?,
        priority: r.get(18)?,
        traceparent: r.get(19)?,
        tracestate: r.get(20)?,
        failure_rail_code: r.get(21)?,
    })
}

/// One receipt row.
pub fn row(conn: &Connection, receipt_id: &str) -> StoreResult<Option<ReceiptRow>> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM receipts WHERE receipt_id = ?1"
    ))?;
    Ok(stmt.query_row([receipt_id], receipt_row).optional()?)
}

/// The rows of `ids` that exist, by id; one statement whatever their number.
pub fn rows_by_id<'a>(
    conn: &Connection,
    ids: impl IntoIterator<Item = &'a str>,
) -> StoreResult<HashMap<String, ReceiptRow>> {
    let ids = json(&ids.into_iter().collect::<Vec<_>>())?;
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM receipts WHERE receipt_id IN (SELECT value FROM jsonb_each(?1))"
    ))?;
    let rows = stmt.query_map([ids], receipt_row)?;
    let mut found = HashMap::new();
    for r in rows {
        let r = r?;
        found.insert(r.receipt_id.clone(), r);
    }
    Ok(found)
}

/// A history entry's columns, in the order of `history_insert!`.
type HistoryValues<'a> = (
    &'a str,
    i64,
    &'static str,
    Option<&'static str>,
    &'a Option<String>,
    &'a Option<String>,
    Option<&'static str>,
    &'a str,
    i64,
    Option<&'static str>,
    Option<i64>,
    &'a Option<String>,
    &'a Option<String>,
    &'a Option<String>,
);

fn history_values<'a>(id: &'a str, h: &'a NewHistory) -> HistoryValues<'a> {
    (
        id,
        h.attempt,
        h.outcome,
        h.code,
        &h.detail_sha256,
        &h.transcript_id,
        h.reason,
        &h.worker_id,
        h.observed_at_ms,
        h.route,
        h.retry_after_ms,
        &h.actor,
        &h.note,
        &h.rail_code,
    )
}

/// Append history entries (a worker's or an operator's), in order: one
/// prepared statement stepped once per entry, with plain values. (A JSON
/// batch read by `jsonb_each` cost SQLite's JSON functions more than the
/// insert itself: docs/perf-log/sqlite.md, "SQLite's JSON batches".)
pub fn append_history(conn: &Connection, entries: &[(&str, &NewHistory)]) -> StoreResult<()> {
    let mut stmt = conn.prepare_cached(concat!(
        history_insert!(),
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
    ))?;
    for (id, h) in entries {
        stmt.execute(history_values(id, h))?;
    }
    Ok(())
}

/// A batch as the JSON text `jsonb_each` reads (`jsonb_each` rather than
/// `json_each`: each element stays binary, so `->>` does not parse it again).
pub fn json<T: serde::Serialize>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| StoreError::backend(format!("encoding a batch: {e}")))
}
