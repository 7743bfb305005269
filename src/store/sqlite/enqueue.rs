//! Enqueue on the writer's synchronous connection, run by the group-commit
//! writer inside the group's transaction (see `outcome`, `lease` and `act`
//! for the other writes).

use rusqlite::Connection;

use super::super::rows::to_i64;
use super::super::rules;
use super::lookup::{json, row, rows_by_id};
use super::values;
use crate::domain::{StoreError, UnixMs};
use crate::store::{Enqueued, NewReceipt, StoreResult};

/// One receipt to enqueue, with the clock of its call.
#[derive(Debug, Clone)]
pub struct EnqueueItem {
    pub receipt: NewReceipt,
    pub now: i64,
}

/// Store receipts; each is judged on its own. Few statements whatever the
/// batch size: `INSERT … SELECT FROM (VALUES …) … ON CONFLICT DO NOTHING`
/// (256 rows a statement) that returns the ids it created, and one read of
/// the rows that already existed, whose identity is then compared in Rust.
pub fn enqueue(conn: &Connection, items: &[EnqueueItem]) -> StoreResult<Vec<Enqueued>> {
    let mut rows = Vec::with_capacity(items.len());
    for EnqueueItem { receipt, now } in items {
        let finalized_at = to_i64(receipt.finalized_at, "finalized_at")?;
        let visible = receipt.visible_at_ms.map_or(*now, UnixMs::as_i64);
        // The observation travels as its JSON text and is stored as that text.
        let observation = receipt
            .observation
            .as_ref()
            .map(serde_json::Value::to_string);
        rows.push((
            receipt.receipt_id.as_str(),
            finalized_at,
            observation,
            visible,
            now,
            receipt.group.as_str(),
            receipt.priority.get(),
            receipt.trace.as_ref().map(|t| t.traceparent()),
            receipt.trace.as_ref().and_then(|t| t.tracestate()),
        ));
    }
    let mut created = INSERT.ids(conn, &rows)?;
    // The groups of the receipts just created (only those: a refused
    // receipt changes nothing) get their row.
    let named = rules::named_groups(
        items
            .iter()
            .map(|i| &i.receipt)
            .filter(|r| created.contains(r.receipt_id.as_str())),
    );
    if !named.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT INTO receipt_groups (name) SELECT value FROM json_each(?1) WHERE true \
             ON CONFLICT (name) DO NOTHING",
        )?;
        stmt.execute([json(&named)?])?;
    }
    let existing = rows_by_id(
        conn,
        items.iter().filter_map(|i| {
            let id = i.receipt.receipt_id.as_str();
            (!created.contains(id)).then_some(id)
        }),
    )?;
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let id = item.receipt.receipt_id.as_str();
        // The first occurrence of a new id created it; a repeat in the same
        // batch is compared with what the first one stored.
        let result = if created.remove(id) {
            Enqueued::Created
        } else if let Some(stored) = existing.get(id) {
            rules::same_identity(stored, &item.receipt)?
        } else {
            // Created by an earlier occurrence in this batch.
            let stored = row(conn, id)?
                .ok_or_else(|| StoreError::internal("receipt vanished during enqueue"))?;
            rules::same_identity(&stored, &item.receipt)?
        };
        results.push(result);
    }
    Ok(results)
}

/// The insert of a batch of receipts: 9 columns a row (id, finalized at,
/// observation, due, now, group, priority, trace parent and state), in
/// batch order, so that the first occurrence of a repeated id is the one that
/// creates it. The padding rows (a NULL id) are left out; the condition also
/// lets SQLite tell the upsert clause from a join.
static INSERT: values::Sized = values::Sized::new(9, |values| {
    format!(
        "INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
         row_version, next_visible_at_ms, created_at_ms, receipt_group, priority, \
         traceparent, tracestate) \
         SELECT column1, column2, column3, 'active', 0, 0, column4, column5, column6, column7, \
         column8, column9 FROM (VALUES {values}) WHERE column1 IS NOT NULL \
         ON CONFLICT (receipt_id) DO NOTHING RETURNING receipt_id"
    )
});
