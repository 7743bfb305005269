//! SQLite backend: one writer connection (writes are serialized by SQLite
//! anyway, so queueing them in-process avoids `SQLITE_BUSY`), a small pool of
//! readers, WAL with `synchronous=FULL` so every acknowledged commit is durable.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::Notify;

use super::rows::{HistoryRow, ReceiptRow, to_i64};
use super::rules::{self, Cas, Change, NewHistory};
use super::*;
use crate::receipt_columns;

/// The SQLite store.
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    binding: SettlementStoreBinding,
    notify: Arc<Notify>,
    expiries: AtomicU64,
}

type Tx = Transaction<'static, Sqlite>;

/// The state a row reports at `?1`, in SQL.
macro_rules! state_case {
    () => {
        "(CASE WHEN status <> 'active' THEN status WHEN lease_until_ms > ?1 THEN 'leased' \
          WHEN attempts = 0 THEN 'pending' ELSE 'retry_scheduled' END)"
    };
}

const CAS_WHERE: &str = "receipt_id = ?1 AND status = 'active' AND finalized_at = ?2 \
     AND attempts = ?3 AND row_version = ?4 AND lease_owner = ?5 AND lease_token = ?6 \
     AND lease_until_ms = ?7 AND lease_until_ms > ?8";

impl SqliteStore {
    /// Open (creating if missing) and migrate the database at `url` (`sqlite:PATH`).
    pub async fn open(url: &str) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| SettlementRouteError::backend(format!("migration failed: {e}")))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sqlx::query(
            "INSERT INTO store_identity (id, binding) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(rules::new_binding()?.to_vec())
        .execute(&writer)
        .await?;
        let bytes: Vec<u8> = sqlx::query_scalar("SELECT binding FROM store_identity WHERE id = 1")
            .fetch_one(&writer)
            .await?;
        let digest: [u8; 32] = bytes
            .try_into()
            .map_err(|_| SettlementRouteError::invalid_record("store binding"))?;
        Ok(Self {
            writer,
            reader,
            binding: SettlementStoreBinding::from_digest(digest),
            notify: Arc::new(Notify::new()),
            expiries: AtomicU64::new(0),
        })
    }

    /// The writer pool, for tests that need to reach under the store.
    #[doc(hidden)]
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    async fn begin(&self) -> StoreResult<Tx> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn row(tx: &mut Tx, receipt_id: &str) -> StoreResult<Option<ReceiptRow>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE receipt_id = ?1"
        ))
        .bind(receipt_id)
        .fetch_optional(&mut **tx)
        .await?)
    }

    async fn history(tx: &mut Tx, receipt_id: &str) -> StoreResult<Vec<HistoryRow>> {
        Ok(sqlx::query_as(
            "SELECT attempt, outcome, code, detail_sha256, transcript_id, reason, worker_id, \
             observed_at_ms, route FROM receipt_history WHERE receipt_id = ?1 ORDER BY id",
        )
        .bind(receipt_id)
        .fetch_all(&mut **tx)
        .await?)
    }

    async fn append_history(tx: &mut Tx, receipt_id: &str, h: &NewHistory) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
             transcript_id, reason, worker_id, observed_at_ms, route) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )
        .bind(receipt_id)
        .bind(h.attempt)
        .bind(h.outcome)
        .bind(h.code)
        .bind(&h.detail_sha256)
        .bind(&h.transcript_id)
        .bind(h.reason)
        .bind(&h.worker_id)
        .bind(h.observed_at_ms)
        .bind(h.route)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Lease one due row inside `tx`; the row must have been read in `tx`.
    async fn lease(
        tx: &mut Tx,
        row: &ReceiptRow,
        worker_id: &WorkerId,
        now: i64,
        until: i64,
    ) -> StoreResult<SettlementAttemptClaim> {
        let version = rules::next_row_version(row.row_version)?;
        let token = rules::new_lease_token()?;
        let updated: Option<ReceiptRow> = sqlx::query_as(concat!(
            "UPDATE receipts SET row_version = ?3, lease_owner = ?4, lease_token = ?5, \
             lease_until_ms = ?6 WHERE receipt_id = ?1 AND row_version = ?2 AND status = 'active' \
             AND next_visible_at_ms <= ?7 AND (lease_until_ms IS NULL OR lease_until_ms <= ?7) \
             RETURNING ",
            receipt_columns!()
        ))
        .bind(&row.receipt_id)
        .bind(row.row_version)
        .bind(version)
        .bind(worker_id.as_str())
        .bind(&token)
        .bind(until)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?;
        updated
            .ok_or_else(|| SettlementRouteError::conflict("row changed while being claimed"))?
            .claim()
    }

    async fn apply(tx: &mut Tx, cas: &Cas<'_>, observed: i64, change: &Change) -> StoreResult<u64> {
        let sql = match change {
            Change::Settle { .. } => {
                "UPDATE receipts SET status = 'settled', transcript_id = ?9, next_visible_at_ms = NULL, \
                 lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
            }
            Change::Skip { .. } => {
                "UPDATE receipts SET status = 'skipped', skip_reason = ?9, next_visible_at_ms = NULL, \
                 lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
            }
            Change::Retry { .. } => {
                "UPDATE receipts SET attempts = ?9, next_visible_at_ms = ?10, failure_code = ?11, \
                 failure_sha256 = ?12, lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL WHERE "
            }
            Change::DeadLetter { .. } => {
                "UPDATE receipts SET status = 'dead_lettered', attempts = ?9, failure_code = ?10, \
                 failure_sha256 = ?11, next_visible_at_ms = NULL, lease_owner = NULL, lease_token = NULL, \
                 lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
            }
        };
        let sql = sqlx::AssertSqlSafe(format!("{sql}{CAS_WHERE}"));
        let query = sqlx::query(sql)
            .bind(cas.receipt_id)
            .bind(cas.finalized_at)
            .bind(cas.attempts)
            .bind(cas.row_version)
            .bind(cas.lease_owner)
            .bind(cas.lease_token)
            .bind(cas.lease_until_ms)
            .bind(observed);
        let query = match change {
            Change::Settle { transcript_id } => query.bind(transcript_id.clone()),
            Change::Skip { reason } => query.bind(*reason),
            Change::Retry {
                attempts,
                next_visible_at_ms,
                code,
                sha256,
            } => query
                .bind(*attempts)
                .bind(*next_visible_at_ms)
                .bind(*code)
                .bind(sha256.clone()),
            Change::DeadLetter {
                attempts,
                code,
                sha256,
            } => query.bind(*attempts).bind(*code).bind(sha256.clone()),
        };
        Ok(query.execute(&mut **tx).await?.rows_affected())
    }

    async fn record_one(
        tx: &mut Tx,
        claim: &SettlementAttemptClaim,
        input: &SettlementRoutingInput,
        policy: RetryPolicy,
        observed_at_ms: u64,
    ) -> StoreResult<StoreResult<SettlementRoute>> {
        let plan = match rules::plan_outcome(claim, input, policy, observed_at_ms) {
            Ok(plan) => plan,
            Err(e) => return Ok(Err(e)),
        };
        if plan.lease_live {
            let cas = Cas::of(claim)?;
            if Self::apply(tx, &cas, plan.observed_at_ms, &plan.change).await? == 1 {
                Self::append_history(tx, &claim.receipt_id, &plan.history).await?;
                return Ok(Ok(plan.route));
            }
        }
        let row = Self::row(tx, &claim.receipt_id).await?;
        Ok(rules::explain_miss(
            row.as_ref(),
            claim,
            Some(input),
            observed_at_ms,
        ))
    }

    async fn read_view(&self, receipt_id: &str, now: i64) -> StoreResult<Option<ReceiptView>> {
        let mut tx = self.reader.begin().await?;
        let Some(row) = Self::row(&mut tx, receipt_id).await? else {
            return Ok(None);
        };
        let history = Self::history(&mut tx, receipt_id).await?;
        tx.commit().await?;
        row.view(now, history).map(Some)
    }
}

/// Backend errors abort the whole call; everything else is judged per item.
fn keep_going<T>(result: StoreResult<T>) -> StoreResult<StoreResult<T>> {
    match result {
        Err(e @ SettlementRouteError::Backend { .. }) => Err(e),
        other => Ok(other),
    }
}

#[async_trait]
impl SettlementOutcomeStore for SqliteStore {
    fn settlement_store_binding(&self) -> SettlementStoreBinding {
        self.binding
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    fn work_notifier(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM store_identity")
            .fetch_one(&self.reader)
            .await?;
        Ok(())
    }

    async fn enqueue(&self, receipts: &[NewReceipt], now_ms: u64) -> StoreResult<Vec<Enqueued>> {
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let mut results = Vec::with_capacity(receipts.len());
        for receipt in receipts {
            let finalized_at = to_i64(receipt.finalized_at, "finalized_at")?;
            let visible = receipt
                .visible_at_ms
                .map_or(Ok(now), |v| to_i64(v, "visible_at_ms"))?;
            let observation = receipt
                .observation
                .as_ref()
                .map(serde_json::Value::to_string);
            let inserted = sqlx::query(
                "INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
                 row_version, next_visible_at_ms, created_at_ms) VALUES (?1, ?2, ?3, 'active', 0, 0, ?4, ?5) \
                 ON CONFLICT (receipt_id) DO NOTHING",
            )
            .bind(receipt.receipt_id.as_str())
            .bind(finalized_at)
            .bind(&observation)
            .bind(visible)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let result = if inserted == 1 {
                Enqueued::Created
            } else {
                let existing = Self::row(&mut tx, receipt.receipt_id.as_str())
                    .await?
                    .ok_or_else(|| {
                        SettlementRouteError::backend("receipt vanished during enqueue")
                    })?;
                rules::same_identity(&existing, receipt)?
            };
            results.push(result);
        }
        tx.commit().await?;
        if results.contains(&Enqueued::Created) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn claim_receipt(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: u64,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        let now = to_i64(now_ms, "now_ms")?;
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let mut tx = self.begin().await?;
        let Some(row) = Self::row(&mut tx, receipt_id.as_str()).await? else {
            return Ok(ReceiptClaim::NoActiveWork);
        };
        let found = match row.status.as_str() {
            "active" if row.lease_live(now) => ReceiptClaim::Leased,
            "active" if row.next_visible_at_ms.is_some_and(|v| v > now) => {
                ReceiptClaim::NotYetVisible
            }
            "active" => {
                ReceiptClaim::Claimed(Self::lease(&mut tx, &row, worker_id, now, until).await?)
            }
            _ => ReceiptClaim::NoActiveWork,
        };
        tx.commit().await?;
        if matches!(found, ReceiptClaim::Claimed(_)) && row.lease_until_ms.is_some() {
            self.expiries.fetch_add(1, Ordering::Relaxed);
        }
        Ok(found)
    }

    async fn claim_due(
        &self,
        worker_id: &WorkerId,
        now_ms: u64,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
    ) -> StoreResult<Vec<SettlementAttemptClaim>> {
        let now = to_i64(now_ms, "now_ms")?;
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let mut tx = self.begin().await?;
        let rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE status = 'active' AND next_visible_at_ms <= ?1 \
              AND (lease_until_ms IS NULL OR lease_until_ms <= ?1) \
              ORDER BY next_visible_at_ms, receipt_id LIMIT ?2"
        ))
        .bind(now)
        .bind(i64::try_from(limit.get()).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            // Any error here drops `tx`, rolling back every lease of the batch.
            claims.push(Self::lease(&mut tx, row, worker_id, now, until).await?);
        }
        tx.commit().await?;
        let expired = rows.iter().filter(|r| r.lease_until_ms.is_some()).count();
        self.expiries.fetch_add(expired as u64, Ordering::Relaxed);
        Ok(claims)
    }

    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(SettlementAttemptClaim, SettlementRoutingInput)],
        policy: RetryPolicy,
        observed_at_ms: u64,
    ) -> StoreResult<Vec<StoreResult<SettlementRoute>>> {
        let mut tx = self.begin().await?;
        let mut results = Vec::with_capacity(outcomes.len());
        for (claim, input) in outcomes {
            let result = Self::record_one(&mut tx, claim, input, policy, observed_at_ms).await;
            results.push(keep_going(result.and_then(|r| r))?);
        }
        tx.commit().await?;
        if results
            .iter()
            .any(|r| matches!(r, Ok(SettlementRoute::RetryScheduled { .. })))
        {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn extend_lease(
        &self,
        claim: &SettlementAttemptClaim,
        extend_ms: LeaseMs,
        now_ms: u64,
    ) -> StoreResult<SettlementAttemptClaim> {
        let cas = Cas::of(claim)?;
        let now = to_i64(now_ms, "now_ms")?;
        let until = rules::lease_deadline(now_ms, extend_ms.get())?;
        let mut tx = self.begin().await?;
        let sql = sqlx::AssertSqlSafe(format!(
            "UPDATE receipts SET lease_until_ms = ?9 WHERE {CAS_WHERE} RETURNING {}",
            receipt_columns!()
        ));
        let updated: Option<ReceiptRow> = sqlx::query_as(sql)
            .bind(cas.receipt_id)
            .bind(cas.finalized_at)
            .bind(cas.attempts)
            .bind(cas.row_version)
            .bind(cas.lease_owner)
            .bind(cas.lease_token)
            .bind(cas.lease_until_ms)
            .bind(now)
            .bind(until)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = updated else {
            let row = Self::row(&mut tx, &claim.receipt_id).await?;
            return Err(rules::explain_miss(row.as_ref(), claim, None, now_ms).unwrap_err());
        };
        let extended = row.claim()?;
        tx.commit().await?;
        Ok(extended)
    }

    async fn release_lease(&self, claim: &SettlementAttemptClaim, now_ms: u64) -> StoreResult<()> {
        let cas = Cas::of(claim)?;
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let sql = sqlx::AssertSqlSafe(format!(
            "UPDATE receipts SET lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, \
             next_visible_at_ms = ?8 WHERE {CAS_WHERE}"
        ));
        let released = sqlx::query(sql)
            .bind(cas.receipt_id)
            .bind(cas.finalized_at)
            .bind(cas.attempts)
            .bind(cas.row_version)
            .bind(cas.lease_owner)
            .bind(cas.lease_token)
            .bind(cas.lease_until_ms)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if released != 1 {
            let row = Self::row(&mut tx, &claim.receipt_id).await?;
            return Err(rules::explain_miss(row.as_ref(), claim, None, now_ms).unwrap_err());
        }
        Self::append_history(
            &mut tx,
            &claim.receipt_id,
            &rules::release_entry(claim, now),
        )
        .await?;
        tx.commit().await?;
        self.notify.notify_waiters();
        Ok(())
    }

    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: u64,
    ) -> StoreResult<Option<ReceiptView>> {
        self.read_view(receipt_id.as_str(), to_i64(now_ms, "now_ms")?)
            .await
    }

    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        let (after_at, after_id) = match after {
            Some((at, id)) => (to_i64(at, "cursor")?, id),
            None => (-1, String::new()),
        };
        let rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE status = 'dead_lettered' AND (finalized_at, receipt_id) > (?1, ?2) \
              ORDER BY finalized_at, receipt_id LIMIT ?3"
        ))
        .bind(after_at)
        .bind(after_id)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .filter_map(|r| r.dead_letter().transpose())
            .collect()
    }

    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        let row: Option<ReceiptRow> = sqlx::query_as(concat!(
            "SELECT ",
            receipt_columns!(),
            " FROM receipts WHERE receipt_id = ?1"
        ))
        .bind(receipt_id.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map_or(Ok(None), |r| r.dead_letter())
    }

    async fn redrive(
        &self,
        receipt_id: &ReceiptId,
        now_ms: u64,
    ) -> StoreResult<Option<ReceiptView>> {
        let now = to_i64(now_ms, "now_ms")?;
        let mut tx = self.begin().await?;
        let Some(row) = Self::row(&mut tx, receipt_id.as_str()).await? else {
            return Ok(None);
        };
        let Some(letter) = row.dead_letter()? else {
            return Ok(None);
        };
        sqlx::query(
            "UPDATE receipts SET status = 'active', attempts = 0, next_visible_at_ms = ?2, \
             finished_at_ms = NULL WHERE receipt_id = ?1 AND status = 'dead_lettered'",
        )
        .bind(receipt_id.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        Self::append_history(
            &mut tx,
            receipt_id.as_str(),
            &rules::redrive_entry(&letter, now),
        )
        .await?;
        let row = Self::row(&mut tx, receipt_id.as_str())
            .await?
            .ok_or_else(|| SettlementRouteError::backend("receipt vanished during redrive"))?;
        let view = row.view(now, Self::history(&mut tx, receipt_id.as_str()).await?)?;
        tx.commit().await?;
        self.notify.notify_waiters();
        Ok(Some(view))
    }

    async fn status(&self, now_ms: u64, limit: usize) -> StoreResult<StatusView> {
        let now = to_i64(now_ms, "now_ms")?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut tx = self.reader.begin().await?;
        let counted: Vec<(String, i64)> = sqlx::query_as(concat!(
            "SELECT ",
            state_case!(),
            " AS st, COUNT(*) FROM receipts GROUP BY st"
        ))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(next_visible_at_ms) FROM receipts WHERE status = 'active' \
             AND next_visible_at_ms <= ?1 AND (lease_until_ms IS NULL OR lease_until_ms <= ?1)",
        )
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let mut samples = Vec::new();
        for state in ReceiptState::ALL {
            let rows: Vec<rules::SampleRow> = sqlx::query_as(concat!(
                "SELECT receipt_id, finalized_at, attempts FROM receipts WHERE ",
                state_case!(),
                " = ?2 ORDER BY finalized_at, receipt_id LIMIT ?3"
            ))
            .bind(now)
            .bind(state.as_str())
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
            samples.push((state, rows));
        }
        tx.commit().await?;
        rules::build_status(now, counted, oldest, samples)
    }

    async fn purge_finished(&self, finished_before_ms: u64, limit: usize) -> StoreResult<u64> {
        let before = to_i64(finished_before_ms, "finished_before_ms")?;
        let mut tx = self.begin().await?;
        // History rows go with their receipt (ON DELETE CASCADE).
        let deleted = sqlx::query(
            "DELETE FROM receipts WHERE receipt_id IN (SELECT receipt_id FROM receipts \
             WHERE status IN ('settled', 'skipped') AND finished_at_ms < ?1 LIMIT ?2)",
        )
        .bind(before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }

    fn lease_expiries_observed(&self) -> u64 {
        self.expiries.load(Ordering::Relaxed)
    }
}
