//! Claims: by id under a row lock, or a batch as one
//! `FOR UPDATE SKIP LOCKED` statement that is all or nothing.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use sqlx::PgPool;

use super::super::rows::to_i64;
use super::{PostgresStore, Tx, begin, finish, row_for_update, storable};
use crate::domain::{
    ClaimLimit, LeaseMs, ReceiptId, SettlementAttemptClaim, SettlementRouteError, WorkerId,
};
use crate::store::rows::ReceiptRow;
use crate::store::{ReceiptClaim, StoreResult, rules};

/// Lease every due row, up to `$2`, in claim order, in one statement. Each
/// claim position has its owner, token (made in Rust) and deadline (`$3`,
/// `$4`, `$5`), so that the batch claims of several workers can share the
/// statement. An out-of-range version is left as it is, for Rust to refuse
/// before commit.
const CLAIM_DUE: &str = concat!(
    "WITH locked AS (SELECT receipt_id, row_version, next_visible_at_ms, lease_until_ms FROM receipts \
       WHERE status = 'active' AND held_at_ms IS NULL AND next_visible_at_ms <= $1 \
       AND (lease_until_ms IS NULL OR lease_until_ms <= $1) \
       ORDER BY next_visible_at_ms, receipt_id LIMIT $2 FOR UPDATE SKIP LOCKED), \
     picked AS (SELECT receipt_id AS pick_id, row_version AS prior_version, lease_until_ms AS prior_until, \
       row_number() OVER (ORDER BY next_visible_at_ms, receipt_id) AS pick FROM locked) \
     UPDATE receipts SET row_version = CASE WHEN prior_version BETWEEN 0 AND 9223372036854775806 \
       THEN prior_version + 1 ELSE prior_version END, \
       lease_owner = slot_owner, lease_token = slot_token, lease_until_ms = slot_until \
     FROM picked JOIN unnest($3::text[], $4::text[], $5::int8[]) WITH ORDINALITY \
       AS slots (slot_owner, slot_token, slot_until, slot) ON slot = pick \
     WHERE receipt_id = pick_id RETURNING pick, prior_version, prior_until, ",
    pg_receipt_columns!()
);

/// Whether anything is due at `$1`.
const ANY_DUE: &str = "SELECT EXISTS (SELECT 1 FROM receipts WHERE status = 'active' \
     AND held_at_ms IS NULL AND next_visible_at_ms <= $1 AND (lease_until_ms IS NULL OR lease_until_ms <= $1))";

/// Lease one row read (and locked) in the same transaction.
const LEASE: &str = concat!(
    "UPDATE receipts SET row_version = $3, lease_owner = $4, lease_token = $5, lease_until_ms = $6 \
     WHERE receipt_id = $1 AND row_version = $2 AND status = 'active' AND held_at_ms IS NULL \
     AND next_visible_at_ms <= $7 \
     AND (lease_until_ms IS NULL OR lease_until_ms <= $7) RETURNING ",
    pg_receipt_columns!()
);

/// A row leased by [`CLAIM_DUE`], with its claim position and prior version.
#[derive(sqlx::FromRow)]
struct ClaimedRow {
    pick: i64,
    prior_version: i64,
    prior_until: Option<i64>,
    #[sqlx(flatten)]
    row: ReceiptRow,
}

/// A worker id as the database can store it.
fn storable_worker(worker_id: &WorkerId) -> StoreResult<&str> {
    let id = worker_id.as_str();
    if storable(id) {
        Ok(id)
    } else {
        Err(SettlementRouteError::invalid_record(
            "worker_id contains NUL, which PostgreSQL text cannot store",
        ))
    }
}

async fn claim_one(
    tx: &mut Tx,
    expired: &AtomicU64,
    receipt_id: &ReceiptId,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<ReceiptClaim> {
    let Some(row) = row_for_update(tx, receipt_id.as_str()).await? else {
        return Ok(ReceiptClaim::NoActiveWork);
    };
    Ok(match row.status.as_str() {
        "active" if row.lease_live(now) => ReceiptClaim::Leased,
        "active" if row.held_at_ms.is_some() => ReceiptClaim::Held,
        "active" if row.next_visible_at_ms.is_some_and(|v| v > now) => ReceiptClaim::NotYetVisible,
        "active" => {
            let version = rules::next_row_version(row.row_version)?;
            let leased: Option<ReceiptRow> = sqlx::query_as(LEASE)
                .bind(&row.receipt_id)
                .bind(row.row_version)
                .bind(version)
                .bind(storable_worker(worker_id)?)
                .bind(rules::new_lease_token()?)
                .bind(until)
                .bind(now)
                .fetch_optional(&mut **tx)
                .await?;
            let leased = leased.ok_or_else(rules::changed_while_claimed)?;
            if row.lease_until_ms.is_some() {
                expired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ReceiptClaim::Claimed(leased.claim()?)
        }
        _ => ReceiptClaim::NoActiveWork,
    })
}

/// Lease due rows to `slots` (owner and deadline per claim position, in
/// order); the claims in position order, fewer when fewer rows are due.
async fn lease_due(
    tx: &mut Tx,
    expired: &AtomicU64,
    slots: &[(&str, i64)],
    now: i64,
) -> StoreResult<Vec<SettlementAttemptClaim>> {
    let tokens = slots
        .iter()
        .map(|_| rules::new_lease_token())
        .collect::<StoreResult<Vec<_>>>()?;
    let mut rows: Vec<ClaimedRow> = sqlx::query_as(CLAIM_DUE)
        .bind(now)
        .bind(i64::try_from(slots.len()).unwrap_or(i64::MAX))
        .bind(slots.iter().map(|(owner, _)| *owner).collect::<Vec<_>>())
        .bind(tokens)
        .bind(slots.iter().map(|(_, until)| *until).collect::<Vec<_>>())
        .fetch_all(&mut **tx)
        .await?;
    rows.sort_by_key(|r| r.pick);
    let reclaimed = rows.iter().filter(|r| r.prior_until.is_some()).count();
    expired.fetch_add(reclaimed as u64, std::sync::atomic::Ordering::Relaxed);
    rows.iter()
        .map(|r| {
            if rules::next_row_version(r.prior_version)? != r.row.row_version {
                return Err(SettlementRouteError::invalid_record(
                    "row_version did not advance",
                ));
            }
            r.row.claim()
        })
        .collect()
}

async fn claim_batch(
    tx: &mut Tx,
    expired: &AtomicU64,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
    limit: usize,
) -> StoreResult<Vec<SettlementAttemptClaim>> {
    if !storable(worker_id.as_str()) {
        // As on SQLite, an empty queue is answered whatever the worker id.
        let due: bool = sqlx::query_scalar(ANY_DUE)
            .bind(now)
            .fetch_one(&mut **tx)
            .await?;
        return if due {
            storable_worker(worker_id).map(|_| Vec::new())
        } else {
            Ok(Vec::new())
        };
    }
    let slots = vec![(worker_id.as_str(), until); limit];
    lease_due(tx, expired, &slots, now).await
}

/// One worker's batch claim, as the claim queue carries it.
pub(super) struct ClaimJob {
    worker_id: WorkerId,
    now: i64,
    until: i64,
    limit: usize,
    expired: Arc<AtomicU64>,
}

impl super::batcher::Mergeable for ClaimJob {
    type Answer = Vec<SettlementAttemptClaim>;

    fn size(&self) -> usize {
        self.limit.max(1)
    }

    fn run(
        pool: &PgPool,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Self::Answer>>, bool)> + Send {
        claim_jobs(pool, jobs)
    }
}

/// One claim in a transaction of its own: all or nothing.
async fn claim_alone(pool: &PgPool, job: &ClaimJob) -> StoreResult<Vec<SettlementAttemptClaim>> {
    let mut tx = begin(pool).await?;
    let result = claim_batch(
        &mut tx,
        &job.expired,
        &job.worker_id,
        job.now,
        job.until,
        job.limit,
    )
    .await;
    finish(tx, result).await
}

/// Several workers' claims in one statement and transaction, served in
/// arrival order: the first takes the first due rows up to its limit, the
/// next the following ones. Due is judged at the earliest of their clocks
/// (they arrived together), so a later one may get fewer rows than are due
/// by its own clock, as a claim that meets locked rows may. A refusal (a
/// stored row out of range) runs each claim alone, so that only the claims
/// that meet the row fail.
async fn claim_jobs(
    pool: &PgPool,
    jobs: &[ClaimJob],
) -> (Vec<StoreResult<Vec<SettlementAttemptClaim>>>, bool) {
    let alone = jobs.len() == 1 || jobs.iter().any(|j| !storable(j.worker_id.as_str()));
    if !alone {
        match claim_merged(pool, jobs).await {
            Ok(Some(answers)) => return (answers.into_iter().map(Ok).collect(), false),
            Ok(None) => {}
            Err(e) => return (jobs.iter().map(|_| Err(e.clone())).collect(), false),
        }
    }
    let mut answers = Vec::with_capacity(jobs.len());
    for job in jobs {
        answers.push(claim_alone(pool, job).await);
    }
    (answers, false)
}

/// `Ok(None)`: refused, and rolled back; run each claim alone.
async fn claim_merged(
    pool: &PgPool,
    jobs: &[ClaimJob],
) -> StoreResult<Option<Vec<Vec<SettlementAttemptClaim>>>> {
    let now = jobs.iter().map(|j| j.now).min().unwrap_or_default();
    let slots: Vec<(&str, i64)> = jobs
        .iter()
        .flat_map(|j| std::iter::repeat_n((j.worker_id.as_str(), j.until), j.limit))
        .collect();
    let mut tx = begin(pool).await?;
    let claims = match lease_due(&mut tx, &jobs[0].expired, &slots, now).await {
        Ok(claims) => claims,
        Err(e @ SettlementRouteError::Backend { .. }) => return finish(tx, Err(e)).await,
        Err(_) => {
            tx.rollback().await?;
            return Ok(None);
        }
    };
    tx.commit().await?;
    let mut claims = claims.into_iter();
    Ok(Some(
        jobs.iter()
            .map(|j| claims.by_ref().take(j.limit).collect())
            .collect(),
    ))
}

impl PostgresStore {
    pub(super) async fn claim_receipt_by_id(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: u64,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        let now = to_i64(now_ms, "now_ms")?;
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let mut tx = self.begin().await?;
        let result = claim_one(&mut tx, &self.expiries, receipt_id, worker_id, now, until).await;
        finish(tx, result).await
    }

    pub(super) async fn claim_due_batch(
        &self,
        worker_id: &WorkerId,
        now_ms: u64,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
    ) -> StoreResult<Vec<SettlementAttemptClaim>> {
        let now = to_i64(now_ms, "now_ms")?;
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        self.claims
            .run(ClaimJob {
                worker_id: worker_id.clone(),
                now,
                until,
                limit: limit.get(),
                expired: self.expiries.clone(),
            })
            .await
    }
}
