//! Outcomes, extensions and releases one item at a time: the fallback for
//! a group whose set-based statement the database refused (a `CHECK`, or a
//! stored row that does not decode), so that the refused item is answered
//! alone and every other one as it would be. Every write repeats the whole
//! claim compare-and-swap, and a miss is explained from the row as it stands.

use sqlx::Acquire;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, PgPool, Postgres};

use super::super::rows::to_i64;
use super::super::rules::{self, Cas, Change, NewHistory, Plan, cas_sql};
use super::{Tx, announce, begin, finish, in_id_order, row};
use crate::domain::{Claim, Claimed, LeaseMs, Outcome, RetryPolicy, Route, StoreError};
use crate::store::StoreResult;
use crate::store::rows::ReceiptRow;

/// The whole claim compare-and-swap: `$1..$7` the claim, `$8` the clock.
macro_rules! cas_where {
    () => {
        cas_sql!("status"; "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8")
    };
}

/// A guarded update that appends its history entry (`$9..$18`) only when
/// the guard matched, so the statement affects one row or none.
macro_rules! guarded {
    ($set:literal) => {
        concat!(
            "WITH changed AS (UPDATE receipts SET ",
            $set,
            " WHERE ",
            cas_where!(),
            " RETURNING receipt_id) INSERT INTO receipt_history (receipt_id, attempt, outcome, \
             code, detail_sha256, transcript_id, reason, worker_id, observed_at_ms, route, \
             retry_after_ms) \
             SELECT receipt_id, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18 FROM changed"
        )
    };
}

const SETTLE: &str = guarded!(
    "status = 'settled', transcript_id = $19, next_visible_at_ms = NULL, lease_owner = NULL, \
     lease_token = NULL, lease_until_ms = NULL, finished_at_ms = $8"
);
const SKIP: &str = guarded!(
    "status = 'skipped', skip_reason = $19, next_visible_at_ms = NULL, lease_owner = NULL, \
     lease_token = NULL, lease_until_ms = NULL, finished_at_ms = $8"
);
const RETRY: &str = guarded!(
    "attempts = $19, next_visible_at_ms = $20, failure_code = $21, failure_sha256 = $22, \
     lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL"
);
const DEAD_LETTER: &str = guarded!(
    "status = 'dead_lettered', attempts = $19, failure_code = $20, failure_sha256 = $21, \
     next_visible_at_ms = NULL, lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, \
     finished_at_ms = $8"
);
const RELEASE: &str = guarded!(
    "lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, next_visible_at_ms = $8"
);
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

fn guarded(
    sql: &'static str,
    cas: &Cas<'_>,
    now: i64,
    h: &NewHistory,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(cas.receipt_id.to_owned())
        .bind(cas.finalized_at)
        .bind(cas.attempts)
        .bind(cas.row_version)
        .bind(cas.lease_owner.to_owned())
        .bind(cas.lease_token.to_owned())
        .bind(cas.lease_until_ms)
        .bind(now)
        .bind(h.attempt)
        .bind(h.outcome)
        .bind(h.code)
        .bind(h.detail_sha256.clone())
        .bind(h.transcript_id.clone())
        .bind(h.reason)
        .bind(h.worker_id.clone())
        .bind(h.observed_at_ms)
        .bind(h.route)
        .bind(h.retry_after_ms)
}

/// Apply a planned change and its history entry; `true` when the guard matched.
async fn apply(conn: &mut PgConnection, cas: &Cas<'_>, plan: &Plan) -> StoreResult<bool> {
    let (h, now) = (&plan.history, plan.observed_at_ms);
    let query = match &plan.change {
        Change::Settle { transcript_id } => {
            guarded(SETTLE, cas, now, h).bind(transcript_id.clone())
        }
        Change::Skip { reason } => guarded(SKIP, cas, now, h).bind(*reason),
        Change::Retry {
            attempts,
            next_visible_at_ms,
            code,
            sha256,
        } => guarded(RETRY, cas, now, h)
            .bind(*attempts)
            .bind(*next_visible_at_ms)
            .bind(*code)
            .bind(sha256.clone()),
        Change::DeadLetter {
            attempts,
            code,
            sha256,
        } => guarded(DEAD_LETTER, cas, now, h)
            .bind(*attempts)
            .bind(*code)
            .bind(sha256.clone()),
    };
    Ok(query.execute(conn).await?.rows_affected() == 1)
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
    observed_at_ms: u64,
) -> StoreResult<Option<StoreResult<Route>>> {
    let plan = match rules::plan_outcome(claim, input, policy, observed_at_ms) {
        Ok(plan) => plan,
        Err(refusal) => {
            let found = row(tx, claim.receipt_id.as_str()).await?;
            let refused = rules::refused_plan(found.as_ref(), claim, refusal, observed_at_ms);
            return Ok(Some(Err(refused)));
        }
    };
    let cas = Cas::of(claim);
    if plan.lease_live {
        if !careful {
            match apply(&mut *tx, &cas, &plan).await {
                Ok(true) => return Ok(Some(Ok(plan.route))),
                Ok(false) => {}
                Err(e @ StoreError::Backend { .. }) => return Err(e),
                Err(_) => return Ok(None),
            }
        } else {
            let mut item = Acquire::begin(&mut *tx).await?;
            match apply(&mut item, &cas, &plan).await {
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
    observed_at_ms: u64,
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
    let results: Vec<_> = results.into_iter().flatten().collect();
    if results.iter().any(retried) {
        announce(tx).await?;
    }
    Ok(Some(results))
}

pub(super) fn retried(result: &StoreResult<Route>) -> bool {
    matches!(result, Ok(Route::RetryScheduled { .. }))
}

async fn extend(tx: &mut Tx, claim: &Claim, now_ms: u64, until: i64) -> StoreResult<Claimed> {
    let cas = Cas::of(claim);
    let now = to_i64(now_ms, "now_ms")?;
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

async fn release(tx: &mut Tx, claim: &Claim, now_ms: u64) -> StoreResult<()> {
    let cas = Cas::of(claim);
    let now = to_i64(now_ms, "now_ms")?;
    let released = guarded(RELEASE, &cas, now, &rules::release_entry(claim, now))
        .execute(&mut **tx)
        .await?
        .rows_affected()
        == 1;
    if !released {
        let row = row(tx, claim.receipt_id.as_str()).await?;
        return Err(miss(rules::explain_miss(row.as_ref(), claim, None, now_ms)));
    }
    Ok(announce(tx).await?)
}

/// Record one caller's outcomes in a transaction of their own: without
/// savepoints first, then with one per item when the database refused one.
pub(super) async fn record_outcomes(
    pool: &PgPool,
    outcomes: &[(Claim, Outcome)],
    policy: RetryPolicy,
    observed_at_ms: u64,
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
            let careful = careful
                .and_then(|r| r.ok_or_else(|| StoreError::backend("careful retry asked to retry")));
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
    now_ms: u64,
) -> StoreResult<Claimed> {
    let until = rules::lease_deadline(now_ms, extend_ms.get())?;
    let mut tx = begin(pool).await?;
    let result = extend(&mut tx, claim, now_ms, until).await;
    finish(tx, result).await
}

/// Release one lease in a transaction of its own.
pub(super) async fn release_claim(pool: &PgPool, claim: &Claim, now_ms: u64) -> StoreResult<()> {
    let mut tx = begin(pool).await?;
    let result = release(&mut tx, claim, now_ms).await;
    finish(tx, result).await
}
