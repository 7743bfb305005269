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

mod batcher;
mod careful;
mod claim;
mod commit_gate;
mod conninfo;
mod feed;
mod group_limits;
mod guarded;
mod keepalive;
mod listen;
mod lookup;
mod outcome;
mod primary;
mod read;
mod schema;
mod search;
mod stats;
mod tx;
mod vacuum;
mod write;

pub use conninfo::is_keyword_form;
pub use primary::{WriterState, is_disconnect, is_unwritable};
pub use schema::{DEFAULT_SCHEMA, check_schema_name, conn_info, connect_options, prepare};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgPool, PgPoolOptions, PgRow};
use sqlx::query::QueryAs;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::fair::Turn;
use super::group_list::{self, GroupListRow};
use super::{explain, rules};
use crate::domain::{
    BackendFault, Claim, ClaimLimit, Claimed, GroupLimits, GroupName, LeaseMs, Outcome, ReceiptId,
    RetryPolicy, Route, SettlementStoreBinding, StoreError, UnixMs, WorkerId,
};
use crate::store::{
    ActionResult, BackendKind, DeadLetter, DeadLetterCursor, DueClaims, Enqueued, FeedRead,
    FeedStart, GroupQuery, GroupView, NewReceipt, OperatorAction, ReceiptClaim, ReceiptFilter,
    ReceiptView, SearchPage, SearchResults, SettlementOutcomeStore, SharedStore, StatsMinute,
    StatusView, StoreResult,
};

/// Pool and timeout settings for PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Pool size (the `LISTEN` connection comes on top).
    pub max_connections: u32,
    /// How long to wait for a connection, new or pooled, before failing.
    pub connect_timeout_ms: u64,
    /// `statement_timeout` of every pooled connection; 0 disables it.
    pub statement_timeout_ms: u64,
    /// The schema holding settled's tables, created if missing.
    pub schema: String,
    /// Vacuum the receipts table once this many of its row versions (and a
    /// tenth of its live rows) are dead; 0 leaves it to autovacuum.
    pub vacuum_dead_rows: u64,
    /// Give up on a server that stops answering without a reset after about
    /// this long (TCP keepalives, `TCP_USER_TIMEOUT`); 0 leaves the system's.
    pub tcp_timeout_ms: u64,
}

/// The statement of a round of guarded writes (outcomes, releases), for
/// the test that reads its plan.
#[doc(hidden)]
pub const GUARDED_WRITE_SQL: &str = guarded::WRITE_ROUND;

/// The statement of a batch claim, for the test that reads its plan.
#[doc(hidden)]
pub const CLAIM_SQL: &str = claim::CLAIM_DUE;

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            connect_timeout_ms: 5_000,
            statement_timeout_ms: 5_000,
            schema: DEFAULT_SCHEMA.to_owned(),
            vacuum_dead_rows: 20_000,
            tcp_timeout_ms: 10_000,
        }
    }
}

/// The channel on which replicas announce work that became due. Channels
/// are per database, not per schema: deployments in two schemas of one
/// database wake each other's long polls, which then just look again.
const CHANNEL: &str = "settled_work";

type Tx = Transaction<'static, Postgres>;

use lookup::{history, row, row_for_update};
use tx::{begin, begin_claim, begin_read, commit, finish};

/// The PostgreSQL store.
pub struct PostgresStore {
    pool: PgPool,
    binding: SettlementStoreBinding,
    notify: Arc<Notify>,
    listener: AbortHandle,
    /// The task keeping the receipts table vacuumed, when on.
    vacuum: Option<AbortHandle>,
    /// Which server is the writer, and the task following it.
    primary: Arc<primary::Primary>,
    follower: AbortHandle,
    /// Where this replica's next claim's turn over the groups starts after.
    turn: Turn,
    /// Longest a store call may take before it is answered as a backend
    /// failure, so that a silent network cannot hold a request (the server's
    /// `statement_timeout` cannot end a call whose answers never arrive).
    bound: Option<Duration>,
    /// Outcomes, extensions and releases, coalesced.
    writes: batcher::Batcher<outcome::Job>,
    /// Batch claims, coalesced.
    claims: batcher::Batcher<claim::ClaimJob>,
}

/// How many groups each queue (writes, batch claims) of one replica may run
/// at a time: an eighth of the pool, 1 to 4 (2 at the default pool of 16).
/// The first runs whatever is queued; the others only while a large backlog
/// waits (`batcher`), so that small requests queue and merge into few
/// statements while batches still use the database's cores side by side.
/// Measured on a 2-core database against two groups that both took every
/// request: one by one 17 % more receipts a second for 35 % less database
/// CPU each, claim/outcome p99 at half the peak 15.2/13.3 -> 10.9/9.5 ms,
/// batched within the spread (one group alone lost 17 % there;
/// BENCHMARKS.md). A larger pool (for a larger database server) runs more.
fn write_tasks(max_connections: u32) -> usize {
    usize::try_from(max_connections / 8).map_or(1, |n| n.clamp(1, WRITE_TASKS))
}

const WRITE_TASKS: usize = 4;

impl PostgresStore {
    /// Connect to `url` (`postgres://…`), migrate, and start listening for
    /// other replicas' wakeups.
    pub async fn open(url: &str, options: &PostgresOptions) -> StoreResult<SharedStore> {
        Ok(Arc::new(Self::connect(url, options).await?))
    }

    /// [`PostgresStore::open`], returning the concrete store.
    pub async fn connect(url: &str, options: &PostgresOptions) -> StoreResult<Self> {
        let info = conn_info(url, &options.schema)?;
        let acquire_timeout = Duration::from_millis(options.connect_timeout_ms);
        let statement_timeout = options.statement_timeout_ms;
        let tcp = info.tcp_timeouts(keepalive::TcpTimeouts::within(Duration::from_millis(
            options.tcp_timeout_ms,
        )));
        let single = info.hosts.len() == 1;
        let primary = primary::Primary::new(
            info.hosts,
            info.connect_timeout.unwrap_or(acquire_timeout),
            tcp,
        );
        // With one host, its own connection error (in words) is the message;
        // with several, the search says what each one answered.
        if !single {
            primary.find_at_start().await.map_err(|said| {
                StoreError::backend(format!(
                    "no PostgreSQL server in --database-url accepts writes: {said}"
                ))
            })?;
        }
        let connect = primary.options();
        prepare(&connect, &options.schema, acquire_timeout).await?;
        if single {
            // Only to know its timeline; a read-only server is refused below.
            let _ = primary.find_at_start().await;
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(acquire_timeout)
            .after_connect({
                let primary = primary.clone();
                move |conn, _meta| {
                    let primary = primary.clone();
                    Box::pin(async move {
                        schema::session(conn, statement_timeout).await?;
                        primary.accept(conn).await
                    })
                }
            })
            // A connection opened before the writer changed is never lent
            // out again, nor kept when it comes back (src/store/postgres/primary.rs).
            .test_before_acquire(false)
            .before_acquire({
                let primary = primary.clone();
                move |conn, meta| {
                    let primary = primary.clone();
                    Box::pin(async move { primary.lend(conn, meta.age).await })
                }
            })
            .after_release({
                let primary = primary.clone();
                move |_conn, meta| {
                    let keep = !primary.fenced(meta.age);
                    Box::pin(async move { Ok(keep) })
                }
            })
            .connect_with(connect.clone())
            .await
            .map_err(|e| explain::pg_connect(&connect, &e))?;
        // The first replica to get here picks the binding; every other one reads it back.
        sqlx::query(
            "INSERT INTO store_identity (id, binding) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(rules::new_binding()?.to_vec())
        .execute(&pool)
        .await?;
        let bytes: Vec<u8> = sqlx::query_scalar("SELECT binding FROM store_identity WHERE id = 1")
            .fetch_one(&pool)
            .await?;
        let digest: [u8; 32] = bytes
            .try_into()
            .map_err(|_| StoreError::invalid_record("store binding"))?;
        let notify = Arc::new(Notify::new());
        let listener = listen::start(primary.clone(), acquire_timeout, notify.clone()).await?;
        let bound = (statement_timeout > 0)
            .then(|| Duration::from_millis(statement_timeout) + acquire_timeout * 2);
        let writes = batcher::Batcher::start(
            pool.clone(),
            write_tasks(options.max_connections),
            bound,
            notify.clone(),
        );
        let claims = batcher::Batcher::start(
            pool.clone(),
            write_tasks(options.max_connections),
            bound,
            notify.clone(),
        );
        let vacuum = vacuum::start(primary.clone(), options.vacuum_dead_rows);
        // Last, once nothing can fail: the store's drop is what stops it.
        let follower = tokio::spawn(primary.clone().follow(pool.clone())).abort_handle();
        Ok(Self {
            pool,
            binding: SettlementStoreBinding::from_digest(digest),
            notify,
            listener,
            vacuum,
            primary,
            follower,
            turn: Turn::default(),
            bound,
            writes,
            claims,
        })
    }

    /// The pool, for tests that need to reach under the store.
    #[doc(hidden)]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

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

/// A pool of one connection, kept until the writer changes: for a task
/// that holds its connection for good (the `LISTEN`, the vacuum) and must
/// not take one from the store's pool. Its socket gets the same timeouts as
/// the pool's; `setup` runs on it after connecting.
fn one_kept_connection(
    primary: &Arc<primary::Primary>,
    setup: Option<&'static str>,
) -> PgPoolOptions {
    let primary = primary.clone();
    PgPoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .after_connect(move |conn, _meta| {
            primary.protect_sockets();
            Box::pin(async move {
                if let Some(sql) = setup {
                    sqlx::Executor::execute(&mut *conn, sql).await?;
                }
                Ok(())
            })
        })
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
        self.follower.abort();
        if let Some(vacuum) = &self.vacuum {
            vacuum.abort();
        }
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
        let now = now_ms.as_i64();
        let rows: Vec<GroupListRow> = self
            .bounded(
                self.read_all(
                    sqlx::query_as(query.text(&group_list::PG))
                        .bind(now)
                        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
                        .bind(&query.after),
                ),
            )
            .await?;
        rows.into_iter().map(|r| r.view(now)).collect()
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

    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        let job = outcome::Job::Outcomes {
            items: outcomes.to_vec(),
            policy,
            observed_at_ms,
        };
        self.primary.gate()?;
        match self.watched(self.writes.run(job).await)? {
            outcome::Answer::Outcomes(routes) => Ok(routes),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed> {
        let job = outcome::Job::Extend {
            claim: claim.clone(),
            extend_ms,
            now_ms,
        };
        self.primary.gate()?;
        match self.watched(self.writes.run(job).await)? {
            outcome::Answer::Extend(extended) => self.watched(extended),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }

    async fn release_lease(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
        let job = outcome::Job::Release {
            claim: claim.clone(),
            now_ms,
        };
        self.primary.gate()?;
        match self.watched(self.writes.run(job).await)? {
            outcome::Answer::Release(released) => self.watched(released),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }

    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        self.bounded(self.read_view(receipt_id.as_str(), now_ms))
            .await
    }

    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        self.bounded(self.dead_letter_page(limit, after)).await
    }

    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        let found = self
            .bounded(async { row(&mut *self.pool.acquire().await?, receipt_id.as_str()).await })
            .await?;
        found.map_or(Ok(None), |r| r.dead_letter())
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
        self.bounded(self.status_view(now_ms, limit)).await
    }

    async fn purge_finished(&self, finished_before_ms: UnixMs, limit: usize) -> StoreResult<u64> {
        let before = finished_before_ms.as_i64();
        self.bounded(self.purge_with_horizon(before, limit)).await
    }

    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        self.bounded(self.feed_page(start, limit)).await
    }

    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()> {
        self.bounded(self.add_stat_minutes(minutes, keep_from_ms))
            .await
    }

    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        self.bounded(self.stat_minutes(from_ms, to_ms)).await
    }

    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults> {
        self.bounded(self.find_page(filter, page, now_ms)).await
    }
}
