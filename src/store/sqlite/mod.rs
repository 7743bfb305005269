//! SQLite backend: one synchronous writer connection owned by a group-commit
//! thread (see [`group`]), a small pool of sqlx readers, WAL with
//! `synchronous=FULL` so every acknowledged commit is durable.

mod enqueue;
mod feed;
mod group_commit;
mod groups;
mod lookup;
mod read;
mod search;
mod stats;
mod values;
mod write;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::Notify;

use super::fair::Turn;
use super::group_list::{self, GroupListRow};
use super::{explain, rules};
use crate::domain::{
    Claim, ClaimLimit, Claimed, GroupLimits, GroupName, LeaseMs, Outcome, ReceiptId, RetryPolicy,
    Route, SettlementStoreBinding, StoreError, UnixMs, WorkerId,
};
use crate::store::{
    Acted, ActionResult, BackendKind, DeadLetter, DeadLetterCursor, DueClaims, Enqueued, FeedRead,
    FeedStart, GroupQuery, GroupView, NewReceipt, OperatorAction, ReceiptClaim, ReceiptFilter,
    ReceiptView, SearchPage, SearchResults, SettlementOutcomeStore, StatsMinute, StatusView,
    StoreResult,
};
use enqueue::EnqueueItem;
use group_commit::Writer;
use write::{ExtendItem, OutcomeItem, ReleaseItem};

/// The SQLite store.
pub struct SqliteStore {
    writer: Writer,
    reader: SqlitePool,
    binding: SettlementStoreBinding,
    notify: Arc<Notify>,
    /// Where the next claim's turn over the groups starts after.
    turn: Turn,
}

impl SqliteStore {
    /// Open (creating if missing) and migrate the database at `url` (`sqlite:PATH`).
    pub async fn open(url: &str) -> StoreResult<Self> {
        // The writer and the readers are separate connections to one file.
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(StoreError::backend(
                "in-memory SQLite databases are not supported: use sqlite:PATH",
            ));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| {
                StoreError::backend(format!(
                    "invalid SQLite URL in --database-url: {}. Hint: use sqlite:PATH, e.g. \
                     sqlite:settled.db or sqlite:/var/lib/settled/settled.db",
                    explain::cause(&e)
                ))
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let path = options.get_filename().to_path_buf();
        let existed = path.exists();
        let digest = prepare(&options)
            .await
            .map_err(|cause| explain::sqlite(&path, &cause))?;
        if !existed {
            tracing::info!(path = %path.display(), "created SQLite database {}", path.display());
        }
        let reader = open_readers(options)
            .await
            .map_err(|e| explain::sqlite(&path, &explain::cause(&e)))?;
        Ok(Self {
            writer: Writer::start(path)?,
            reader,
            binding: SettlementStoreBinding::from_digest(digest),
            notify: Arc::new(Notify::new()),
            turn: Turn::default(),
        })
    }
}

/// How many readers serve reads beside the writer.
const READERS: u32 = 4;

/// Every reader, opened before the first request and kept for the life of
/// the process: a connection opened later fails when the process is out of
/// file descriptors (many idle clients), and the read waiting for it would
/// fail with it (an enqueue answered 503 while `/healthz` still served).
async fn open_readers(options: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePoolOptions::new()
        .min_connections(READERS)
        .max_connections(READERS)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    // Hold each until all are open, so every acquire opens a new one.
    let mut opened = Vec::new();
    for _ in 0..READERS {
        opened.push(pool.acquire().await?);
    }
    Ok(pool)
}

/// Create or migrate the file and read its binding (picked on first use);
/// a failure comes back as the database's own words, for [`explain::sqlite`].
async fn prepare(options: &SqliteConnectOptions) -> Result<[u8; 32], String> {
    let cause = |e: sqlx::Error| explain::cause(&e);
    let mut conn = options.connect().await.map_err(cause)?;
    let migrator = sqlx::migrate!("migrations/sqlite");
    let before = applied(&mut conn).await.map_err(cause)?;
    migrator
        .run(&mut conn)
        .await
        .map_err(|e| format!("migration failed: {}", explain::migrate_cause(&e)))?;
    let now_applied: Vec<String> = migrator
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{:04} {}", m.version, m.description))
        .collect();
    if !now_applied.is_empty() {
        tracing::info!(
            migrations = ?now_applied,
            "applied migrations {}",
            now_applied.join(", ")
        );
    }
    let binding = rules::new_binding().map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO store_identity (id, binding) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
    )
    .bind(binding.to_vec())
    .execute(&mut conn)
    .await
    .map_err(cause)?;
    let bytes: Vec<u8> = sqlx::query_scalar("SELECT binding FROM store_identity WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .map_err(cause)?;
    // Migrations ran on sqlx; from here on the synchronous writer owns writes.
    conn.close().await.map_err(cause)?;
    bytes
        .try_into()
        .map_err(|_| "the stored binding is not 32 bytes (a corrupt store_identity)".to_owned())
}

/// Versions of the migrations already applied (none in a new file).
async fn applied(conn: &mut sqlx::SqliteConnection) -> Result<Vec<i64>, sqlx::Error> {
    let present: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if present.is_none() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(conn)
        .await
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

    async fn enqueue(&self, receipts: &[NewReceipt], now_ms: UnixMs) -> StoreResult<Vec<Enqueued>> {
        let now = now_ms.as_i64();
        let items = receipts
            .iter()
            .map(|receipt| EnqueueItem {
                receipt: receipt.clone(),
                now,
            })
            .collect();
        let results = self.writer.enqueue(items).await?;
        if results.contains(&Enqueued::Created) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn claim_receipt(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        let now = now_ms.as_i64();
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let (id, worker) = (receipt_id.clone(), worker_id.clone());
        let found = self
            .writer
            .solo(move |conn| groups::claim_receipt(conn, &id, &worker, now, until))
            .await?;
        Ok(found)
    }

    async fn claim_from(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        let now = now_ms.as_i64();
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let (worker, only, turn) = (worker_id.clone(), only.to_vec(), self.turn.clone());
        self.writer
            .solo(move |conn| groups::claim_due(conn, &worker, now, until, limit, &only, &turn))
            .await
    }

    async fn groups(&self, now_ms: UnixMs, query: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        let now = now_ms.as_i64();
        let rows: Vec<GroupListRow> = sqlx::query_as(query.text(&group_list::SQLITE))
            .bind(now)
            .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
            .bind(&query.after)
            .fetch_all(&self.reader)
            .await?;
        rows.into_iter().map(|r| r.view(now)).collect()
    }

    async fn set_group(
        &self,
        group: &GroupName,
        limits: &GroupLimits,
        now_ms: UnixMs,
    ) -> StoreResult<()> {
        let now = now_ms.as_i64();
        let (group, limits) = (group.clone(), *limits);
        self.writer
            .solo(move |conn| groups::set_limits(conn, &group, &limits, now))
            .await?;
        // Resumed or raised: waiting claims look again.
        self.notify.notify_waiters();
        Ok(())
    }

    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        let items = outcomes
            .iter()
            .map(|(claim, input)| OutcomeItem {
                claim: claim.clone(),
                input: input.clone(),
                policy,
                observed_at_ms,
            })
            .collect();
        let results = self.writer.outcomes(items).await?;
        if results
            .iter()
            .any(|r| matches!(r, Ok(Route::RetryScheduled { .. })))
        {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed> {
        let until = rules::lease_deadline(now_ms, extend_ms.get())?;
        self.writer
            .extend(ExtendItem {
                claim: claim.clone(),
                now_ms,
                until,
            })
            .await
    }

    async fn release_lease(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
        self.writer
            .release(ReleaseItem {
                claim: claim.clone(),
                now_ms,
            })
            .await?;
        self.notify.notify_waiters();
        Ok(())
    }

    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        read::view(&self.reader, receipt_id.as_str(), now_ms.as_i64()).await
    }

    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        read::dead_letters(&self.reader, limit, after).await
    }

    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        let mut conn = self.reader.acquire().await?;
        read::row(&mut conn, receipt_id.as_str())
            .await?
            .map_or(Ok(None), |r| r.dead_letter())
    }

    async fn act(
        &self,
        action: &OperatorAction,
        receipt_ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        let now = now_ms.as_i64();
        let (op, ids, who) = (
            action.clone(),
            receipt_ids.to_vec(),
            actor.map(str::to_owned),
        );
        let results = self
            .writer
            .solo(move |conn| write::act(conn, &op, &ids, who.as_deref(), now, dry_run))
            .await?;
        if action.may_make_due() && results.contains(&Ok(Acted::Done)) && !dry_run {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn status(&self, now_ms: UnixMs, limit: usize) -> StoreResult<StatusView> {
        read::status(&self.reader, now_ms.as_i64(), limit).await
    }

    async fn purge_finished(&self, finished_before_ms: UnixMs, limit: usize) -> StoreResult<u64> {
        let before = finished_before_ms.as_i64();
        self.writer
            .solo(move |conn| feed::purge(conn, before, limit))
            .await
    }

    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        let mut tx = self.reader.begin().await?;
        let read = super::feed::read(&mut feed::Reader(&mut tx), start, limit).await?;
        tx.commit().await?;
        Ok(read)
    }

    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()> {
        let keep_from = keep_from_ms.as_i64();
        let minutes = minutes.to_vec();
        self.writer
            .background(move |conn| stats::add(conn, &minutes, keep_from))
            .await
    }

    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        stats::read(&self.reader, from_ms.as_i64(), to_ms.as_i64()).await
    }

    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults> {
        search::find(&self.reader, filter, page, now_ms.as_i64()).await
    }
}

#[cfg(test)]
mod background_tests;
#[cfg(test)]
mod merge_tests;
#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod test_support;
