//! Outcomes, extensions and releases one item at a time: the fallback for
//! a group whose set-based statement the database refused (a `CHECK`, or a
//! stored row that does not decode), so that the refused item is answered
//! alone and every other one as it would be. Every write repeats the whole
//! claim compare-and-swap, and a miss is explained from the row as it stands.

use sqlx::Acquire;
use sqlx::{PgConnection, PgPool};

use super::super::rules::{self, Cas, Plan};
use super::guarded::{self, Write, pg_cas};
use super::{Tx, begin, finish, in_id_order, row};
use crate::domain::{Claim, Claimed, LeaseMs, Outcome, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::StoreResult;
use crate::store::rows::ReceiptRow;

/// The whole claim compare-and-swap: `$1..$7` the claim, `$8` the clock.
macro_rules! cas_where {
    () => {
        pg_cas!("$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8")
    };
}

const EXTEND: &str = concat!(
    "UPDATE receipts SET lease_until_ms = $9 WHERE ",
    cas_where!(),
    " RETURNING ",
    pg_receipt_columns!()
);

/// A guard without a replay never matches; its answer is the error.
fn miss(explained: StoreResult<Route>) -> StoreError {
    explained.err().unwrap_or_else(rules::mismatch)
}

/// Apply a planned change and its history entry with the statement of the
/// set-based path (one writer of what an outcome writes); `true` when the
/// guard matched. A retry made due is announced by the statement.
async fn apply(conn: &mut PgConnection, claim: &Claim, plan: &Plan) -> StoreResult<bool> {
    guarded::write_one(conn, Write::outcome(claim, plan)).await
}

/// One outcome. Any database error aborts a PostgreSQL transaction, so in
/// `careful` mode the write runs under a savepoint: a refused item is undone
/// alone and the batch goes on, as on SQLite. Savepoints cost two round trips
/// per item, so a batch is first tried without them; `Ok(None)` asks for the
/// careful retry when an item was refused by the database.
async fn record_one(
    tx: &mut Tx,
    careful: bool,
    claim: &Claim,
    input: &Outcome,
    policy: RetryPolicy,
    observed_at_ms: UnixMs,
) -> StoreResult<Option<StoreResult<Route>>> {
    let plan = match rules::plan_outcome(claim, input, policy, observed_at_ms) {
        Ok(plan) => plan,
        Err(refusal) => {
            let found = row(tx, claim.receipt_id.as_str()).await?;
            let refused = rules::refused_plan(found.as_ref(), claim, refusal, observed_at_ms);
            return Ok(Some(Err(refused)));
        }
    };
    if plan.lease_live {
        if !careful {
            match apply(&mut *tx, claim, &plan).await {
                Ok(true) => return Ok(Some(Ok(plan.route))),
                Ok(false) => {}
                Err(e @ StoreError::Backend { .. }) => return Err(e),
                Err(_) => return Ok(None),
            }
        } else {
            let mut item = Acquire::begin(&mut *tx).await?;
            match apply(&mut item, claim, &plan).await {
                Ok(matched) => {
                    item.commit().await?;
                    if matched {
                        return Ok(Some(Ok(plan.route)));
                    }
                }
                Err(e @ StoreError::Backend { .. }) => return Err(e),
                Err(e) => {
                    item.rollback().await?;
                    return Ok(Some(Err(e)));
                }
            }
        }
    }
    let row = row(tx, claim.receipt_id.as_str()).await?;
    Ok(Some(rules::explain_miss(
        row.as_ref(),
        claim,
        Some(input),
        observed_at_ms,
    )))
}

/// Backend errors abort the whole call; everything else is judged per item.
/// `Ok(None)`: retry the batch in careful mode.
async fn record_all(
    tx: &mut Tx,
    careful: bool,
    outcomes: &[(Claim, Outcome)],
    policy: RetryPolicy,
    observed_at_ms: UnixMs,
) -> StoreResult<Option<Vec<StoreResult<Route>>>> {
    let mut results: Vec<Option<StoreResult<Route>>> = outcomes.iter().map(|_| None).collect();
    for i in in_id_order(outcomes, |(claim, _)| claim.receipt_id.as_str()) {
        let (claim, input) = &outcomes[i];
        match record_one(tx, careful, claim, input, policy, observed_at_ms).await {
            Err(e @ StoreError::Backend { .. }) => return Err(e),
            Err(e) => results[i] = Some(Err(e)),
            Ok(None) => return Ok(None),
            Ok(Some(result)) => results[i] = Some(result),
        }
    }
    Ok(Some(results.into_iter().flatten().collect()))
}

pub(super) fn retried(result: &StoreResult<Route>) -> bool {
    matches!(result, Ok(Route::RetryScheduled { .. }))
}

async fn extend(tx: &mut Tx, claim: &Claim, now_ms: UnixMs, until: i64) -> StoreResult<Claimed> {
    let cas = Cas::of(claim);
    let now = now_ms.as_i64();
    let updated: Option<ReceiptRow> = sqlx::query_as(EXTEND)
        .bind(cas.receipt_id)
        .bind(cas.finalized_at)
        .bind(cas.attempts)
        .bind(cas.row_version)
        .bind(cas.lease_owner)
        .bind(cas.lease_token)
        .bind(cas.lease_until_ms)
        .bind(now)
        .bind(until)
        .fetch_optional(&mut **tx)
        .await?;
    match updated {
        Some(row) => row.claimed(None),
        None => {
            let row = row(tx, claim.receipt_id.as_str()).await?;
            Err(miss(rules::explain_miss(row.as_ref(), claim, None, now_ms)))
        }
    }
}

async fn release(tx: &mut Tx, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
    let now = now_ms.as_i64();
    if !guarded::write_one(tx, Write::release(claim, now)).await? {
        let row = row(tx, claim.receipt_id.as_str()).await?;
        return Err(miss(rules::explain_miss(row.as_ref(), claim, None, now_ms)));
    }
    Ok(())
}

/// Record one caller's outcomes in a transaction of their own: without
/// savepoints first, then with one per item when the database refused one.
pub(super) async fn record_outcomes(
    pool: &PgPool,
    outcomes: &[(Claim, Outcome)],
    policy: RetryPolicy,
    observed_at_ms: UnixMs,
) -> StoreResult<Vec<StoreResult<Route>>> {
    let mut tx = begin(pool).await?;
    let fast = record_all(&mut tx, false, outcomes, policy, observed_at_ms).await;
    match fast {
        Ok(Some(results)) => finish(tx, Ok(results)).await,
        // An item was refused by the database, which aborted the
        // transaction: start again with a savepoint per item.
        Ok(None) => {
            tx.rollback().await?;
            let mut tx = begin(pool).await?;
            let careful = record_all(&mut tx, true, outcomes, policy, observed_at_ms).await;
            let careful = careful.and_then(|r| {
                r.ok_or_else(|| StoreError::internal("careful retry asked to retry"))
            });
            finish(tx, careful).await
        }
        Err(e) => finish(tx, Err(e)).await,
    }
}

/// Extend one lease in a transaction of its own.
pub(super) async fn extend_claim(
    pool: &PgPool,
    claim: &Claim,
    extend_ms: LeaseMs,
    now_ms: UnixMs,
) -> StoreResult<Claimed> {
    let until = rules::lease_deadline(now_ms, extend_ms.get())?;
    let mut tx = begin(pool).await?;
    let result = extend(&mut tx, claim, now_ms, until).await;
    finish(tx, result).await
}

/// Release one lease in a transaction of its own.
pub(super) async fn release_claim(pool: &PgPool, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
    let mut tx = begin(pool).await?;
    let result = release(&mut tx, claim, now_ms).await;
    finish(tx, result).await
}
