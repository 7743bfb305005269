//! Transactions: how the store opens, commits and gives them up.

use sqlx::postgres::PgPool;

use super::{Tx, commit_gate};
use crate::domain::StoreError;
use crate::store::StoreResult;

/// A transaction on a pooled connection.
pub(super) async fn begin(pool: &PgPool) -> StoreResult<Tx> {
    begin_with(pool, "BEGIN").await
}

/// Settings that keep a transaction's statements on plain index ranges.
/// Every statement of a claim or a read is meant to read index ranges
/// bounded by what it takes, the page, the leases out or the groups; on a
/// table that grew since it was last analyzed the planner can take a scan of
/// the whole table as cheaper (the lapsed leases, for instance; the oldest
/// lapsed lease of `/v1/status` was a parallel scan of every row, ~160 ms a
/// call), so these transactions rule that out. Bitmap scans too: on a server
/// that has run longer than its leases, the lapsed range of
/// `receipts_leases` holds an entry for every leased row version not yet
/// vacuumed, and a bitmap scan fetches each of those dead rows from the
/// table at every call (docs/perf-log/postgres-write-path.md, "A server that has run
/// longer than its leases"). A plain index scan marks
/// each dead entry once, and later scans step over it without the table.
macro_rules! index_ranges_only {
    () => {
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
    };
}

/// A transaction for a claim, on index ranges only ([`index_ranges_only`]).
/// Its statements are planned once per connection (`force_generic_plan`):
/// the claim statement's custom plan was made again at every call, as long
/// as running it (0.6 ms each, most of a one-by-one claim). A claim changes
/// no receipt count (only the lease and the row version), so the counting
/// trigger is told to leave it
/// (migrations/postgres/0015_counts_in_statement.sql).
pub(super) async fn begin_claim(pool: &PgPool) -> StoreResult<Tx> {
    begin_with(pool, BEGIN_CLAIM).await
}

macro_rules! begin_claim_sql {
    () => {
        concat!(
            "BEGIN; ",
            index_ranges_only!(),
            "; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL settled.counted = on"
        )
    };
}

/// What opens a claim's transaction ([`begin_claim`]).
pub(super) const BEGIN_CLAIM: &str = begin_claim_sql!();

/// A claim transaction's `COMMIT`, and the next one opened, as one query
/// (src/store/postgres/kept.rs).
pub(super) const COMMIT_AND_BEGIN: &str = concat!("COMMIT; ", begin_claim_sql!());

/// A consistent snapshot for reads, on index ranges only
/// ([`index_ranges_only`]). Its statements are planned once per connection
/// (`force_generic_plan`), as claims are: each read is written as index
/// ranges, so a plan made for given values is the same plan, and making it
/// again cost more than running it (docs/perf-log/postgres-write-path.md, "PostgreSQL reads
/// planned once"). The search plans test reads the generic plan of every
/// search statement.
pub(super) async fn begin_read(pool: &PgPool) -> StoreResult<Tx> {
    begin_with(
        pool,
        concat!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; ",
            index_ranges_only!(),
            "; SET LOCAL plan_cache_mode = force_generic_plan"
        ),
    )
    .await
}

/// A transaction for a page of the idle-group sweep
/// (src/store/postgres/idle_groups.rs), on index ranges only
/// ([`index_ranges_only`]: its probes of the claim index were scans of the
/// whole table on a table that grew since it was analyzed), waiting at most
/// 100 ms for a lock: while the sweep waits for the group table, new
/// enqueues queue behind it.
pub(super) async fn begin_sweep(pool: &PgPool) -> StoreResult<Tx> {
    begin_with(
        pool,
        concat!(
            "BEGIN; ",
            index_ranges_only!(),
            "; SET LOCAL lock_timeout = '100ms'"
        ),
    )
    .await
}

/// A transaction opened with `statement`, on a task of its own: sqlx 0.9.0
/// returns a connection to the pool still inside a transaction when the
/// future of `begin` is dropped during its `BEGIN` round trip (a client that
/// went away, a time limit), and the next borrower's statements then run in
/// it (launchbadge/sqlx#4393). On its own task the `BEGIN` always completes,
/// and a transaction nobody takes is rolled back when dropped.
async fn begin_with(pool: &PgPool, statement: &'static str) -> StoreResult<Tx> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin_with(statement).await })
        .await
        .map_err(|e| StoreError::backend(format!("opening a transaction: {e}")))?
        .map_err(Into::into)
}

/// Commit after success; roll back at once after a failure. A dropped
/// transaction would only roll back when its connection is next used, and
/// until then its row locks would hide rows from `SKIP LOCKED` claims.
/// Commit `tx`, unless the call's time limit gave it up first (then it is
/// rolled back, as dropped).
pub(super) async fn commit(tx: Tx) -> StoreResult<()> {
    commit_gate::may_commit()?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn finish<T>(tx: Tx, result: StoreResult<T>) -> StoreResult<T> {
    match result {
        Ok(value) => {
            commit(tx).await?;
            Ok(value)
        }
        Err(error) => {
            // The original error matters more than a failed rollback, which
            // leaves the connection to be discarded by the pool anyway.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}
