//! PostgreSQL backend: a pool whose connections carry a statement timeout,
//! row locks where SQLite has its single writer, claims as one
//! `FOR UPDATE SKIP LOCKED` statement, and `LISTEN/NOTIFY` so that long polls
//! wake up on every replica.

/// `receipt_columns!` (`store::rows`) as PostgreSQL returns them:
/// the observation is a `json` column, read back as its exact text.
macro_rules! pg_receipt_columns {
    () => {
        "receipt_id, finalized_at, observation::text AS observation, status, attempts, \
         row_version, next_visible_at_ms, lease_owner, lease_token, lease_until_ms, \
         failure_code, failure_sha256, transcript_id, skip_reason, finished_at_ms, held_at_ms, \
         cancel_reason, receipt_group, priority, traceparent, tracestate, failure_rail_code"
    };
}

/// True where the server takes no writes, as libpq's `read-write` and
/// `primary` checks judge together: the pool's and the writer check's
/// question (`primary.rs`) and `/readyz`'s.
macro_rules! refuses_writes {
    () => {
        "pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"
    };
}

mod act;
mod batcher;
mod careful;
mod claim;
mod claim_batch;
mod commit_gate;
mod conninfo;
mod enqueue;
mod feed;
mod groups;
mod guarded;
mod idle_groups;
mod keepalive;
mod kept;
mod lease;
mod listen;
mod lookup;
mod open;
mod outcome;
mod primary;
mod read;
mod read_again;
mod schema;
mod search;
mod stats;
mod turns;
mod tx;
mod upkeep;
mod write_round;
mod writes;

pub use conninfo::is_keyword_form;
pub use open::PostgresOptions;
pub use primary::{WriterState, is_disconnect, is_unwritable};
pub use schema::{DEFAULT_SCHEMA, check_schema_name, conn_info, connect_options, prepare};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::query::QueryAs;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::domain::{
    BackendFault, Claim, ClaimLimit, Claimed, GroupLimits, GroupName, LeaseMs, Outcome, ReceiptId,
    RetryPolicy, Route, SettlementStoreBinding, StoreError, UnixMs, WorkerId,
};
use crate::store::{
    ActionResult, BackendKind, ClaimAsk, DeadLetter, DeadLetterCursor, DueClaims, Enqueued,
    FeedRead, FeedStart, GroupQuery, GroupView, NewReceipt, OperatorAction, ReceiptClaim,
    ReceiptFilter, ReceiptView, Reported, SearchPage, SearchResults, SettlementOutcomeStore,
    StatsMinute, StatusView, StoreResult, SweptGroups,
};

/// The channel on which replicas announce work that became due. Channels
/// are per database, not per schema: deployments in two schemas of one
/// database wake each other's long polls, which then just look again.
const CHANNEL: &str = "settled_work";

type Tx = Transaction<'static, Postgres>;

use lookup::{history, row, row_for_update};
use open::one_kept_connection;
use tx::{begin, begin_claim, begin_read, commit, finish};

/// The PostgreSQL store.
pub struct PostgresStore {
    pool: PgPool,
    binding: SettlementStoreBinding,
    notify: Arc<Notify>,
    listener: AbortHandle,
    /// The upkeep lock and the vacuum, when this replica holds it.
    upkeep: upkeep::Upkeep,
    /// Which server is the writer, and the task following it.
    primary: Arc<primary::Primary>,
    follower: AbortHandle,
    /// Longest a store call may take before it is answered as a backend
    /// failure, so that a silent network cannot hold a request (the server's
    /// `statement_timeout` cannot end a call whose answers never arrive).
    bound: Option<Duration>,
    /// Outcomes, extensions and releases, coalesced.
    writes: batcher::Batcher<writes::Job>,
    /// Batch claims, coalesced.
    claims: batcher::Batcher<claim_batch::ClaimJob>,
}

impl PostgresStore {
    /// Run one store call within [`Self::bound`].
    /// Given up only before its commit is sent (src/store/postgres/commit_gate.rs).
    async fn bounded<T>(&self, call: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        self.primary.gate()?;
        self.watched(commit_gate::within(self.bound, call).await)
    }

    /// Pass `result` on; a failure that says something about the server
    /// makes the replica look for the writer again (src/store/postgres/primary.rs).
    fn watched<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        self.primary.watch(result)
    }

    async fn begin(&self) -> StoreResult<Tx> {
        begin(&self.pool).await
    }

    async fn begin_read(&self) -> StoreResult<Tx> {
        begin_read(&self.pool).await
    }

    /// Every row `query` returns, from a read transaction of its own.
    async fn read_all<O>(&self, query: QueryAs<'_, Postgres, O, PgArguments>) -> StoreResult<Vec<O>>
    where
        O: Send + Unpin + for<'r> sqlx::FromRow<'r, PgRow>,
    {
        let mut tx = self.begin_read().await?;
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
        self.follower.abort();
    }
}

/// Positions of `items` in id order; the sort is stable, so repeats of one
/// id keep their order.
fn in_id_order<T>(items: &[T], id: impl Fn(&T) -> &str) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| id(&items[a]).cmp(id(&items[b])));
    order
}

/// Announce, inside `tx`, that work became due; delivered on commit.
async fn announce(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(conn)
        .await?;
    Ok(())
}

#[async_trait]
impl SettlementOutcomeStore for PostgresStore {
    fn settlement_store_binding(&self) -> SettlementStoreBinding {
        self.binding
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn work_notifier(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    async fn ping(&self) -> StoreResult<()> {
        // Migrated, and a writer: a demoted primary still answers reads.
        let check = sqlx::query_as::<_, (i64, bool)>(concat!(
            "SELECT (SELECT COUNT(*) FROM store_identity), ",
            refuses_writes!()
        ));
        let (_, read_only) = self
            .bounded(async { Ok(check.fetch_one(&self.pool).await?) })
            .await?;
        if read_only {
            return self.watched(Err(StoreError::backend_fault(
                BackendFault::WriterLost,
                "the database server accepts no writes",
            )));
        }
        self.primary.vouch();
        Ok(())
    }

    fn writer(&self) -> Option<WriterState> {
        Some(self.primary.state())
    }

    async fn database_clock_ms(&self) -> StoreResult<Option<u64>> {
        let now = sqlx::query_scalar::<_, i64>(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        );
        let ms = self
            .bounded(async { Ok(now.fetch_one(&self.pool).await?) })
            .await?;
        Ok(u64::try_from(ms).ok())
    }

    async fn enqueue(&self, receipts: &[NewReceipt], now_ms: UnixMs) -> StoreResult<Vec<Enqueued>> {
        self.bounded(self.enqueue_receipts(receipts, now_ms)).await
    }

    async fn claim_receipt(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        self.bounded(self.claim_receipt_by_id(receipt_id, worker_id, now_ms, lease_ms))
            .await
    }

    async fn claim_from(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        // Bounded by the claim queue itself, which gives up only before commit.
        self.primary.gate()?;
        self.watched(
            self.claim_due_batch(worker_id, now_ms, lease_ms, limit, only)
                .await,
        )
    }

    async fn groups(&self, now_ms: UnixMs, query: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        self.group_views(now_ms, query).await
    }

    async fn set_group(
        &self,
        group: &GroupName,
        limits: &GroupLimits,
        now_ms: UnixMs,
    ) -> StoreResult<()> {
        self.bounded(self.set_group_limits(group, limits, now_ms))
            .await
    }

    async fn forget_idle_groups(&self, after: &str, limit: usize) -> StoreResult<SweptGroups> {
        self.bounded(self.sweep_idle_groups(after, limit)).await
    }

    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        self.record_outcomes(outcomes, policy, observed_at_ms).await
    }

    async fn record_and_claim(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        ask: ClaimAsk<'_>,
    ) -> StoreResult<Reported> {
        // One transaction for both where it can (src/store/postgres/claim_batch.rs).
        self.primary.gate()?;
        let carried = writes::Job::Outcomes {
            items: outcomes.to_vec(),
            policy,
            observed_at_ms: ask.now_ms,
        };
        let reported = self.watched(self.queue_claim(ask, Some(carried)).await)?;
        Ok(Reported {
            claimed: self.watched(reported.claimed),
            ..reported
        })
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed> {
        self.extend_claim(claim, extend_ms, now_ms).await
    }

    async fn release_lease(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
        self.release_claim(claim, now_ms).await
    }

    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        self.read(|| self.read_view(receipt_id.as_str(), now_ms))
            .await
    }

    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        self.read(|| self.dead_letter_page(limit, after.clone()))
            .await
    }

    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        self.dead_letter_of(receipt_id).await
    }

    async fn act(
        &self,
        action: &OperatorAction,
        receipt_ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        self.bounded(self.act_on(action, receipt_ids, actor, now_ms, dry_run))
            .await
    }

    async fn status(&self, now_ms: UnixMs, limit: usize) -> StoreResult<StatusView> {
        self.read(|| self.status_view(now_ms, limit)).await
    }

    async fn purge_finished(&self, finished_before_ms: UnixMs, limit: usize) -> StoreResult<u64> {
        let before = finished_before_ms.as_i64();
        self.bounded(self.purge_with_horizon(before, limit)).await
    }

    fn does_upkeep(&self) -> bool {
        self.upkeep.mine()
    }

    fn forward_to(&self) -> Option<String> {
        self.upkeep.holder_url()
    }

    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        self.read(|| self.feed_page(start, limit)).await
    }

    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()> {
        self.bounded(self.add_stat_minutes(minutes, keep_from_ms))
            .await
    }

    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        self.read(|| self.stat_minutes(from_ms, to_ms)).await
    }

    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults> {
        self.read(|| self.find_page(filter, page, now_ms)).await
    }
}

#[cfg(test)]
mod act_tests;
#[cfg(test)]
mod collation_tests;
#[cfg(test)]
mod open_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod walk_lock_tests;
