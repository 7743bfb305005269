//! Enqueue on the writer's synchronous connection, run by the group-commit
//! writer inside the group's transaction (see `write` for the other writes).

use std::collections::HashSet;

use rusqlite::Connection;

use super::super::rows::to_i64;
use super::super::rules;
use super::lookup::{json, row, rows_by_id};
use crate::domain::{StoreError, UnixMs};
use crate::store::{Enqueued, NewReceipt, StoreResult};

/// One receipt to enqueue, with the clock of its call.
#[derive(Debug, Clone)]
pub struct EnqueueItem {
    pub receipt: NewReceipt,
    pub now: i64,
}

/// Store receipts; each is judged on its own. Two statements whatever the
/// batch size: one `INSERT … SELECT FROM jsonb_each … ON CONFLICT DO NOTHING`
/// that returns the ids it created, and one read of the rows that already
/// existed, whose identity is then compared in Rust.
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
    let rows = json(&rows)?;

    // `WHERE true` lets SQLite tell the upsert clause from a join; `ORDER BY
    // key` makes the first occurrence of a repeated id the one that creates it.
    let mut created: HashSet<String> = {
        let mut stmt = conn.prepare_cached(
            "INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
             row_version, next_visible_at_ms, created_at_ms, receipt_group, priority, \
             traceparent, tracestate) \
             SELECT value ->> 0, value ->> 1, value ->> 2, 'active', 0, 0, value ->> 3, \
             value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8 \
             FROM jsonb_each(?1) WHERE true ORDER BY key \
             ON CONFLICT (receipt_id) DO NOTHING RETURNING receipt_id",
        )?;
        stmt.query_map([&rows], |r| r.get(0))?
            .collect::<Result<_, _>>()?
    };
    // The groups of the receipts just created (only those: a refused
    // receipt changes nothing) get their row.
    let named = rules::named_groups(
        items
            .iter()
            .map(|i| &i.receipt)
            .filter(|r| created.contains(r.receipt_id.as_str())),
    );
    if !named.is_empty() {
        super::groups::forget_groups();
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
                .ok_or_else(|| StoreError::backend("receipt vanished during enqueue"))?;
            rules::same_identity(&stored, &item.receipt)?
        };
        results.push(result);
    }
    Ok(results)
}
