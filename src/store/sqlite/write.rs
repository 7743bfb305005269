//! Write operations on the writer's synchronous connection, each run by the
//! group-commit writer (see `group`) inside the group's transaction.
//!
//! A batch costs few statements whatever its size: one guarded `UPDATE`
//! repeats the whole claim compare-and-swap per row (outcomes bind their
//! rows as a `VALUES` list, 256 rows a statement; extensions and releases
//! read a JSON array with `jsonb_each`), history entries are one prepared
//! insert each, and only the rows that missed are read back to explain each
//! refusal.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;

use super::super::actions::{self, Binds};
use super::super::rows::ReceiptRow;
use super::super::rules::{self, Cas, NewHistory, NewValues, Plan, cas_sql};
use super::group_commit::in_savepoint;
use super::lookup::{append_history, json, receipt_row, row, rows_by_id};
use super::values;
use crate::domain::{Claim, Claimed, Outcome, ReceiptId, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::rows::receipt_columns;
use crate::store::{Acted, ActionResult, OperatorAction, StoreResult};

/// One outcome of a (possibly merged) batch, with the call's policy and clock.
#[derive(Debug, Clone)]
pub struct OutcomeItem {
    pub claim: Claim,
    pub input: Outcome,
    pub policy: RetryPolicy,
    pub observed_at_ms: UnixMs,
}

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

/// The claim's six fields and the check time, as `jsonb_each` columns 0..=7.
type CasRow<'a> = (&'a str, i64, i64, i64, &'a str, &'a str, i64, i64);

fn cas_row(claim: &Claim, at_ms: UnixMs) -> CasRow<'_> {
    let cas = Cas::of(claim);
    (
        cas.receipt_id,
        cas.finalized_at,
        cas.attempts,
        cas.row_version,
        cas.lease_owner,
        cas.lease_token,
        cas.lease_until_ms,
        at_ms.as_i64(),
    )
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

/// The new column values of an outcome ([`NewValues`]), as columns
/// 9..=17 of [`OUTCOMES`]: status, transcript, skip reason, attempts (null:
/// unchanged), next visible, failure code and digest (null: unchanged),
/// finished at, and the failure's rail code (replaced with the failure).
type ChangeRow = (
    &'static str,
    Option<String>,
    Option<&'static str>,
    Option<i64>,
    Option<i64>,
    Option<&'static str>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

fn change_row(plan: &Plan) -> ChangeRow {
    let v = NewValues::of_plan(plan);
    (
        v.status.as_str(),
        v.transcript_id,
        v.skip_reason,
        v.attempts,
        v.next_visible_at_ms,
        v.failure_code,
        v.failure_sha256,
        v.finished_at_ms,
        v.failure_rail_code,
    )
}

/// One row of [`OUTCOMES`]: the claim's compare-and-swap ([`cas_row`], its
/// lease checked at the outcome's time), then [`change_row`].
struct OutcomeRow<'a>(CasRow<'a>, ChangeRow);

impl values::Row for OutcomeRow<'_> {
    fn push_to<'p>(&'p self, params: &mut Vec<&'p dyn rusqlite::ToSql>) {
        self.0.push_to(params);
        self.1.push_to(params);
    }
}

/// Apply planned outcomes with one guarded `UPDATE`; returns the ids it changed.
fn apply_outcomes(conn: &Connection, planned: &[(&Claim, &Plan)]) -> StoreResult<HashSet<String>> {
    let mut batch = Vec::with_capacity(planned.len());
    for (claim, plan) in planned {
        let c = cas_row(claim, UnixMs::default());
        let cas = (c.0, c.1, c.2, c.3, c.4, c.5, c.6, plan.observed_at_ms);
        batch.push(OutcomeRow(cas, change_row(plan)));
    }
    if batch.len() == 1 {
        // One row: the same guarded update with bound values. `UPDATE … FROM`
        // over a one-row `VALUES` list costs 8 % more instructions a receipt
        // one by one (BENCHMARKS.md, issue 26's table of 2026-12-05, night).
        let row = &batch[0];
        let id = row.0.0;
        let mut params = Vec::with_capacity(17);
        values::Row::push_to(row, &mut params);
        let changed = conn
            .prepare_cached(concat!(
                "UPDATE receipts SET status = ?9, transcript_id = ?10, skip_reason = ?11, \
                 attempts = coalesce(?12, attempts), next_visible_at_ms = ?13, \
                 failure_code = coalesce(?14, failure_code), \
                 failure_sha256 = coalesce(?15, failure_sha256), \
                 failure_rail_code = CASE WHEN ?14 IS NULL THEN failure_rail_code ELSE ?17 END, \
                 lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, \
                 finished_at_ms = ?16 WHERE ",
                cas_sql!("status", "lease_until_ms"; "?1", "?2", "?3", "?4", "?5", "?6", "?7", "?8")
            ))?
            .execute(rusqlite::params_from_iter(params))?;
        return Ok(if changed == 1 {
            HashSet::from([id.to_owned()])
        } else {
            HashSet::new()
        });
    }
    // A refused row fails its statement and the caller applies the round
    // again one by one: a round of several statements must then change
    // nothing either.
    if batch.len() > values::ROWS_MAX {
        in_savepoint(conn, "outcome_rows", |c| Ok(OUTCOMES.ids(c, &batch)?))
    } else {
        Ok(OUTCOMES.ids(conn, &batch)?)
    }
}

/// The guarded `UPDATE` of a batch of outcomes: 17 columns a row, those of
/// [`cas_row`] then those of [`change_row`]; it returns the ids it changed
/// (padding rows are all NULL, and `receipt_id = NULL` matches no row).
pub(super) static OUTCOMES: values::Sized = values::Sized::new(17, |values| {
    format!(
        "UPDATE receipts SET status = b.new_status, transcript_id = b.new_transcript, \
         skip_reason = b.new_reason, attempts = coalesce(b.new_attempts, receipts.attempts), \
         next_visible_at_ms = b.new_visible, \
         failure_code = coalesce(b.new_code, receipts.failure_code), \
         failure_sha256 = coalesce(b.new_sha, receipts.failure_sha256), \
         failure_rail_code = CASE WHEN b.new_code IS NULL THEN receipts.failure_rail_code \
         ELSE b.new_rail END, \
         lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, \
         finished_at_ms = b.new_finished \
         FROM (SELECT column1 AS id, column2 AS fin, column3 AS att, column4 AS rv, \
         column5 AS owner, column6 AS token, column7 AS until, column8 AS at, \
         column9 AS new_status, column10 AS new_transcript, column11 AS new_reason, \
         column12 AS new_attempts, column13 AS new_visible, column14 AS new_code, \
         column15 AS new_sha, column16 AS new_finished, column17 AS new_rail \
         FROM (VALUES {values})) AS b \
         WHERE {cas} RETURNING receipts.receipt_id",
        cas = cas_sql!("+status", "lease_until_ms";
                       "b.id", "b.fin", "b.att", "b.rv", "b.owner", "b.token", "b.until", "b.at"),
    )
});

/// Record outcomes, each judged on its own and answered as if it ran alone
/// in arrival order; a backend error fails the whole call.
pub fn record(conn: &Connection, items: &[OutcomeItem]) -> StoreResult<Vec<StoreResult<Route>>> {
    let mut results: Vec<Option<StoreResult<Route>>> = vec![None; items.len()];
    for round in rules::rounds(items.iter().map(|i| i.claim.receipt_id.as_str())) {
        // Plan every item; those that cannot apply are explained below.
        let mut planned = Vec::new();
        let mut explain: Vec<(usize, Option<StoreError>)> = Vec::new();
        for &i in &round {
            let it = &items[i];
            match rules::plan_outcome(&it.claim, &it.input, it.policy, it.observed_at_ms) {
                Ok(plan) if plan.lease_live => planned.push((i, plan)),
                Ok(_) => explain.push((i, None)),
                Err(refusal) => explain.push((i, Some(refusal))),
            }
        }
        let changed = match apply_planned(conn, items, &planned) {
            Ok(changed) => changed,
            // A refused row (a CHECK) fails the whole statement and changes
            // nothing; apply one by one so that only that item is refused.
            Err(StoreError::InvalidRecord { .. }) if planned.len() > 1 => {
                let mut changed = HashSet::new();
                for one in planned.chunks(1) {
                    match apply_planned(conn, items, one) {
                        Ok(ids) => changed.extend(ids),
                        Err(e @ StoreError::InvalidRecord { .. }) => {
                            results[one[0].0] = Some(Err(e));
                        }
                        Err(e) => return Err(e),
                    }
                }
                changed
            }
            Err(StoreError::InvalidRecord { detail }) if planned.len() == 1 => {
                results[planned[0].0] = Some(Err(StoreError::InvalidRecord { detail }));
                HashSet::new()
            }
            Err(e) => return Err(e),
        };
        let mut entries = Vec::new();
        for (i, plan) in &planned {
            if results[*i].is_some() {
                continue;
            }
            let id = items[*i].claim.receipt_id.as_str();
            if changed.contains(id) {
                results[*i] = Some(Ok(plan.route));
                entries.push((id, &plan.history));
            } else {
                explain.push((*i, None));
            }
        }
        // A refused history entry after an applied change fails the whole
        // call (the caller rolls it back), so the two stand or fall together.
        append_history(conn, &entries)
            .map_err(|e| StoreError::backend(format!("history entry refused: {e}")))?;
        if explain.is_empty() {
            continue;
        }
        let found = rows_by_id(
            conn,
            explain
                .iter()
                .map(|(i, _)| items[*i].claim.receipt_id.as_str()),
        )?;
        for (i, refusal) in explain {
            let it = &items[i];
            let row = found.get(it.claim.receipt_id.as_str());
            results[i] = Some(match refusal {
                Some(refusal) => Err(rules::refused_plan(
                    row,
                    &it.claim,
                    refusal,
                    it.observed_at_ms,
                )),
                None => rules::explain_miss(row, &it.claim, Some(&it.input), it.observed_at_ms),
            });
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::backend("outcome not judged"))))
        .collect())
}

fn apply_planned(
    conn: &Connection,
    items: &[OutcomeItem],
    planned: &[(usize, Plan)],
) -> StoreResult<HashSet<String>> {
    if planned.is_empty() {
        return Ok(HashSet::new());
    }
    let pairs: Vec<_> = planned
        .iter()
        .map(|(i, plan)| (&items[*i].claim, plan))
        .collect();
    apply_outcomes(conn, &pairs)
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

/// Do an operator's action to each receipt, each judged on its own; in a dry
/// run, judge only.
pub fn act(
    conn: &Connection,
    action: &OperatorAction,
    ids: &[ReceiptId],
    actor: Option<&str>,
    now: i64,
    dry_run: bool,
) -> StoreResult<Vec<ActionResult>> {
    let mut results = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.as_str();
        let found = row(conn, id)?;
        let result = actions::judge(action, found.as_ref(), now);
        if let (Ok(Acted::Done), Some(found), false) = (result, &found, dry_run) {
            let mut stmt = conn.prepare_cached(&actions::update_sql(action))?;
            let changed = match action.binds() {
                Binds::Id => stmt.execute([id])?,
                Binds::Now => stmt.execute(rusqlite::params![id, now])?,
                Binds::NowReason(reason) => stmt.execute(rusqlite::params![id, now, reason])?,
            };
            // The single writer read the row just now: nothing can have moved it.
            if changed != 1 {
                return Err(StoreError::backend("operator action changed no row"));
            }
            append_history(conn, &[(id, &actions::entry(action, found, actor, now))])?;
        }
        results.push(result);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::super::super::rules::rounds;

    #[test]
    fn repeated_ids_go_to_later_rounds_in_arrival_order() {
        let ids = ["a", "b", "a", "c", "a", "b"];
        assert_eq!(
            rounds(ids.into_iter()),
            vec![vec![0, 1, 3], vec![2, 5], vec![4]]
        );
    }
}
