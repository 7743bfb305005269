//! Recording outcomes on the writer's synchronous connection, run by the
//! group-commit writer (`group_commit`) inside the group's transaction.
//!
//! A batch costs few statements whatever its size: one guarded `UPDATE`
//! repeats the whole claim compare-and-swap per row (rows bound as a
//! `VALUES` list, 256 rows a statement), history entries are one prepared
//! insert each, and only the rows that missed are read back to explain each
//! refusal.

use std::collections::HashSet;

use rusqlite::Connection;

use super::super::rules::{self, Cas, NewValues, Plan, cas_sql, outcome_set_sql};
use super::group_commit::in_savepoint;
use super::lookup::{append_history, rows_by_id};
use super::values;
use crate::domain::{Claim, Outcome, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::StoreResult;

/// One outcome of a (possibly merged) batch, with the call's policy and clock.
#[derive(Debug, Clone)]
pub struct OutcomeItem {
    pub claim: Claim,
    pub input: Outcome,
    pub policy: RetryPolicy,
    pub observed_at_ms: UnixMs,
}

/// The claim's six fields and the check time, as `jsonb_each` columns 0..=7.
pub(super) type CasRow<'a> = (&'a str, i64, i64, i64, &'a str, &'a str, i64, i64);

pub(super) fn cas_row(claim: &Claim, at_ms: UnixMs) -> CasRow<'_> {
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
        // over a one-row `VALUES` list costs more instructions a receipt one
        // by one (docs/perf-log/postgres-write-path.md).
        let row = &batch[0];
        let id = row.0.0;
        let mut params = Vec::with_capacity(17);
        values::Row::push_to(row, &mut params);
        let changed = conn
            .prepare_cached(concat!(
                "UPDATE receipts SET ",
                outcome_set_sql!(""; status = "?9", transcript = "?10", reason = "?11",
                    attempts = "?12", visible = "?13", code = "?14", sha = "?15",
                    finished = "?16", rail = "?17"),
                " WHERE ",
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
        "UPDATE receipts SET {set} \
         FROM (SELECT column1 AS id, column2 AS fin, column3 AS att, column4 AS rv, \
         column5 AS owner, column6 AS token, column7 AS until, column8 AS at, \
         column9 AS new_status, column10 AS new_transcript, column11 AS new_reason, \
         column12 AS new_attempts, column13 AS new_visible, column14 AS new_code, \
         column15 AS new_sha, column16 AS new_finished, column17 AS new_rail \
         FROM (VALUES {values})) AS b \
         WHERE {cas} RETURNING receipts.receipt_id",
        set = outcome_set_sql!("receipts."; status = "b.new_status",
            transcript = "b.new_transcript", reason = "b.new_reason", attempts = "b.new_attempts",
            visible = "b.new_visible", code = "b.new_code", sha = "b.new_sha",
            finished = "b.new_finished", rail = "b.new_rail"),
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
