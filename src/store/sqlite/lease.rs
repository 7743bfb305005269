//! Extending and releasing leases on the writer's synchronous connection,
//! run by the group-commit writer (`group_commit`) inside the group's
//! transaction: one guarded `UPDATE` per round reading a JSON array with
//! `jsonb_each`, and only the rows that missed read back to explain each
//! refusal.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;

use super::super::rows::ReceiptRow;
use super::super::rules::{self, NewHistory, cas_sql};
use super::lookup::{append_history, json, receipt_row, rows_by_id};
use super::outcome::cas_row;
use crate::domain::{Claim, Claimed, StoreError, UnixMs};
use crate::store::StoreResult;
use crate::store::rows::receipt_columns;

/// One lease extension: the claim, the server clock and the new deadline.
#[derive(Debug, Clone)]
pub struct ExtendItem {
    pub claim: Claim,
    pub now_ms: UnixMs,
    pub until: i64,
}

/// One lease release: the claim and the server clock.
#[derive(Debug, Clone)]
pub struct ReleaseItem {
    pub claim: Claim,
    pub now_ms: UnixMs,
}

/// The compare-and-swap of every row against batch row `b` (columns of
/// [`cas_row`]); the lease must still be live at `b.at`.
macro_rules! cas_from_batch {
    ($extra:literal) => {
        concat!(
            " FROM (SELECT value ->> 0 AS id, value ->> 1 AS fin, value ->> 2 AS att, \
             value ->> 3 AS rv, value ->> 4 AS owner, value ->> 5 AS token, \
             value ->> 6 AS until, value ->> 7 AS at",
            $extra,
            " FROM jsonb_each(?1)) AS b WHERE ",
            cas_sql!("+status", "lease_until_ms";
                     "b.id", "b.fin", "b.att", "b.rv", "b.owner", "b.token", "b.until", "b.at")
        )
    };
}

/// Why a guarded lease write matched nothing.
fn lease_miss(row: Option<&ReceiptRow>, claim: &Claim, now_ms: UnixMs) -> StoreError {
    match rules::explain_miss(row, claim, None, now_ms) {
        Err(e) => e,
        Ok(_) => rules::mismatch(),
    }
}

/// The guarded `UPDATE` of a batch of lease extensions (`jsonb_each` rows
/// of [`cas_row`] and the new deadline).
pub(super) const EXTEND: &str = concat!(
    "UPDATE receipts SET lease_until_ms = b.new_until",
    cas_from_batch!(", value ->> 8 AS new_until"),
    " RETURNING ",
    receipt_columns!()
);

/// The guarded `UPDATE` of a batch of releases (`jsonb_each` rows of
/// [`cas_row`]): each lease ends and its receipt is due at once.
pub(super) const RELEASE: &str = concat!(
    "UPDATE receipts SET lease_owner = NULL, lease_token = NULL, \
     lease_until_ms = NULL, next_visible_at_ms = b.at",
    cas_from_batch!(""),
    " RETURNING receipts.receipt_id"
);

/// Move live leases' deadlines; each judged on its own.
pub fn extend(conn: &Connection, items: &[ExtendItem]) -> StoreResult<Vec<StoreResult<Claimed>>> {
    let mut results: Vec<Option<StoreResult<Claimed>>> = vec![None; items.len()];
    for round in rules::rounds(items.iter().map(|i| i.claim.receipt_id.as_str())) {
        let mut batch = Vec::new();
        for &i in &round {
            let it = &items[i];
            let c = cas_row(&it.claim, it.now_ms);
            batch.push((i, (c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, it.until)));
        }
        let rows: Vec<_> = batch.iter().map(|(_, r)| r).collect();
        let mut updated: HashMap<String, ReceiptRow> = HashMap::new();
        if !rows.is_empty() {
            let mut stmt = conn.prepare_cached(EXTEND)?;
            for r in stmt.query_map([json(&rows)?], receipt_row)? {
                let r = r?;
                updated.insert(r.receipt_id.clone(), r);
            }
        }
        let missed: Vec<usize> = batch
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| !updated.contains_key(items[*i].claim.receipt_id.as_str()))
            .collect();
        let found = rows_by_id(
            conn,
            missed.iter().map(|i| items[*i].claim.receipt_id.as_str()),
        )?;
        for (i, _) in batch {
            let it = &items[i];
            let id = it.claim.receipt_id.as_str();
            results[i] = Some(match updated.get(id) {
                // A corrupt row fails the whole call, so that its savepoint
                // undoes the extension the caller is not told about.
                Some(row) => Ok(row.claimed(None)?),
                None => Err(lease_miss(found.get(id), &it.claim, it.now_ms)),
            });
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::backend("extension not judged"))))
        .collect())
}

/// Give live leases back (each due at once) with a history entry each.
pub fn release(conn: &Connection, items: &[ReleaseItem]) -> StoreResult<Vec<StoreResult<()>>> {
    let mut results: Vec<Option<StoreResult<()>>> = vec![None; items.len()];
    for round in rules::rounds(items.iter().map(|i| i.claim.receipt_id.as_str())) {
        let mut batch = Vec::new();
        for &i in &round {
            let it = &items[i];
            batch.push((i, cas_row(&it.claim, it.now_ms)));
        }
        let rows: Vec<_> = batch.iter().map(|(_, r)| r).collect();
        let mut released = HashSet::new();
        if !rows.is_empty() {
            let mut stmt = conn.prepare_cached(RELEASE)?;
            released = stmt
                .query_map([json(&rows)?], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()?;
        }
        let mut entries = Vec::new();
        let mut missed = Vec::new();
        for (i, _) in &batch {
            let it = &items[*i];
            if released.contains(it.claim.receipt_id.as_str()) {
                let now = it.now_ms.as_i64();
                entries.push((
                    it.claim.receipt_id.as_str(),
                    rules::release_entry(&it.claim, now),
                ));
                results[*i] = Some(Ok(()));
            } else {
                missed.push(*i);
            }
        }
        let refs: Vec<(&str, &NewHistory)> = entries.iter().map(|(id, h)| (*id, h)).collect();
        append_history(conn, &refs)?;
        let found = rows_by_id(
            conn,
            missed.iter().map(|i| items[*i].claim.receipt_id.as_str()),
        )?;
        for i in missed {
            let it = &items[i];
            let row = found.get(it.claim.receipt_id.as_str());
            results[i] = Some(Err(lease_miss(row, &it.claim, it.now_ms)));
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::backend("release not judged"))))
        .collect())
}
