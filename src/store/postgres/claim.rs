//! Claims: by id under a row lock, or a batch as one
//! `FOR UPDATE SKIP LOCKED` statement that is all or nothing.

use super::super::rows::to_i64;
use super::*;

/// Lease every due row, up to `$2`, in claim order, in one statement. Tokens
/// (`$5`, made in Rust) pair with rows by claim order. An out-of-range
/// version is left as it is, for Rust to refuse before commit.
const CLAIM_DUE: &str = concat!(
    "WITH locked AS (SELECT receipt_id, row_version, next_visible_at_ms, lease_until_ms FROM receipts \
       WHERE status = 'active' AND next_visible_at_ms <= $1 \
       AND (lease_until_ms IS NULL OR lease_until_ms <= $1) \
       ORDER BY next_visible_at_ms, receipt_id LIMIT $2 FOR UPDATE SKIP LOCKED), \
     picked AS (SELECT receipt_id AS pick_id, row_version AS prior_version, lease_until_ms AS prior_until, \
       row_number() OVER (ORDER BY next_visible_at_ms, receipt_id) AS pick FROM locked) \
     UPDATE receipts SET row_version = CASE WHEN prior_version BETWEEN 0 AND 9223372036854775806 \
       THEN prior_version + 1 ELSE prior_version END, \
       lease_owner = $3, lease_token = token, lease_until_ms = $4 \
     FROM picked JOIN unnest($5::text[]) WITH ORDINALITY AS tokens (token, token_pick) \
       ON token_pick = pick \
     WHERE receipt_id = pick_id RETURNING pick, prior_version, prior_until, ",
    pg_receipt_columns!()
);

/// Whether anything is due at `$1`.
const ANY_DUE: &str = "SELECT EXISTS (SELECT 1 FROM receipts WHERE status = 'active' \
     AND next_visible_at_ms <= $1 AND (lease_until_ms IS NULL OR lease_until_ms <= $1))";

/// Lease one row read (and locked) in the same transaction.
const LEASE: &str = concat!(
    "UPDATE receipts SET row_version = $3, lease_owner = $4, lease_token = $5, lease_until_ms = $6 \
     WHERE receipt_id = $1 AND row_version = $2 AND status = 'active' AND next_visible_at_ms <= $7 \
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
            let leased = leased
                .ok_or_else(|| SettlementRouteError::conflict("row changed while being claimed"))?;
            if row.lease_until_ms.is_some() {
                expired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ReceiptClaim::Claimed(leased.claim()?)
        }
        _ => ReceiptClaim::NoActiveWork,
    })
}

async fn claim_batch(
    tx: &mut Tx,
    expired: &AtomicU64,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
    limit: ClaimLimit,
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
    let tokens = (0..limit.get())
        .map(|_| rules::new_lease_token())
        .collect::<StoreResult<Vec<_>>>()?;
    let mut rows: Vec<ClaimedRow> = sqlx::query_as(CLAIM_DUE)
        .bind(now)
        .bind(i64::try_from(limit.get()).unwrap_or(i64::MAX))
        .bind(worker_id.as_str())
        .bind(until)
        .bind(tokens)
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
        let mut tx = self.begin().await?;
        // Any error rolls back every lease of the batch.
        let result = claim_batch(&mut tx, &self.expiries, worker_id, now, until, limit).await;
        finish(tx, result).await
    }
}
