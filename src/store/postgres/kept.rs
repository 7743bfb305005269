//! A connection a write queue keeps between groups while requests wait
//! behind them: the next group needs no connection from the pool (whose
//! lending pings it, one round trip), and the claim queue opens the next
//! group's transaction with the commit (`COMMIT; BEGIN …` as one query), so
//! a claim group is its outcomes, the groups' walk, the claim and the
//! commit, no longer also a ping and a `BEGIN`: that is what a one-by-one
//! claim waits for (docs/perf-log/postgres-write-path.md, "Where a one-by-one
//! claim's time goes"). The transaction opened has no snapshot and holds no
//! lock until the next group's first statement.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use super::batcher::Backlog;
use super::commit_gate;
use super::primary::Primary;
use super::tx::{BEGIN_CLAIM, COMMIT_AND_BEGIN};
use crate::store::StoreResult;

/// How long a kept connection waits for the next group, at most. A group
/// that was expected but did not come (its requests given up) leaves it
/// unused: it then goes back to the pool (its transaction rolled back), so
/// that no connection sits idle in a transaction, which monitoring flags,
/// and none is used after the server may have ended it
/// (`idle_in_transaction_session_timeout`, which settled sets to the
/// statement timeout: half of that when it is shorter).
const KEEP_AT_MOST: Duration = Duration::from_secs(1);

/// The least pool that lends a connection to be kept: with fewer, the
/// queue's kept connection would leave too few for other requests.
const KEEP_FROM_POOL: u32 = 4;

/// A queue's kept connection, when it has one.
pub(super) struct Kept {
    next: Mutex<Option<Held>>,
    primary: Arc<Primary>,
    backlog: Backlog,
    /// Numbers the connections kept.
    kept: AtomicU64,
    /// How long one waits for its group ([`KEEP_AT_MOST`]).
    keep_for: Duration,
    /// Whether the pool is large enough to keep one ([`KEEP_FROM_POOL`]).
    keeps: bool,
}

/// A connection from the pool, maybe inside a claim transaction. Dropped
/// inside one (a failure, a call given up), it is closed instead of going
/// back to the pool, where the next borrower's statements would run inside
/// the transaction.
pub(super) struct Held {
    conn: PoolConnection<Postgres>,
    in_transaction: bool,
    /// Taken from the pool after this: a connection the writer's change
    /// fenced since is not used (src/store/postgres/primary.rs).
    since: Instant,
    /// Which connection kept this is (0: none), and since when.
    number: u64,
    kept_at: Instant,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.in_transaction {
            self.conn.close_on_drop();
        }
    }
}

impl Deref for Held {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Held {
    /// Whether it was kept from an earlier group.
    pub fn reused(&self) -> bool {
        self.number != 0
    }
}

impl Kept {
    /// `statement_timeout`: the pool's, `Duration::ZERO` when off.
    pub fn new(
        primary: Arc<Primary>,
        backlog: Backlog,
        statement_timeout: Duration,
        max_connections: u32,
    ) -> Self {
        let keep_for = match statement_timeout / 2 {
            Duration::ZERO => KEEP_AT_MOST,
            half => half.min(KEEP_AT_MOST),
        };
        Self {
            next: Mutex::new(None),
            primary,
            backlog,
            kept: AtomicU64::new(0),
            keep_for,
            keeps: max_connections >= KEEP_FROM_POOL,
        }
    }

    fn slot(&self) -> MutexGuard<'_, Option<Held>> {
        self.next.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept connection if it may still be used; else one from the pool.
    pub async fn acquire(&self, pool: &PgPool) -> StoreResult<Held> {
        let kept = self.slot().take();
        if let Some(held) = kept {
            let fresh = held.kept_at.elapsed() < self.keep_for;
            // Else dropped: back to the pool, or closed inside a transaction.
            if fresh && !self.primary.fenced(held.since.elapsed()) {
                return Ok(held);
            }
        }
        Self::lend(pool).await
    }

    /// A connection from the pool.
    pub async fn lend(pool: &PgPool) -> StoreResult<Held> {
        let since = Instant::now();
        Ok(Held {
            conn: pool.acquire().await?,
            in_transaction: false,
            since,
            number: 0,
            kept_at: since,
        })
    }

    /// A claim transaction: the one opened with the last commit, or a new one.
    pub async fn begin(&self, pool: &PgPool) -> StoreResult<Held> {
        let mut held = self.acquire(pool).await?;
        if !held.in_transaction {
            held.in_transaction = true;
            sqlx::raw_sql(BEGIN_CLAIM).execute(&mut *held).await?;
        }
        Ok(held)
    }

    /// Whether the connection of the group ending now is to be kept.
    fn wanted(&self) -> bool {
        self.keeps && self.backlog.waiting() && self.slot().is_none()
    }

    /// Keep `held` for the next group; it goes back when no group takes it
    /// within [`Self::keep_for`].
    fn keep(self: &Arc<Self>, mut held: Held) {
        held.number = self.kept.fetch_add(1, Ordering::Relaxed) + 1;
        held.kept_at = Instant::now();
        let (number, keep_for) = (held.number, self.keep_for);
        // Another task's, if one got there first, goes with the one it replaces.
        drop(self.slot().replace(held));
        let kept = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(keep_for).await;
            let Some(kept) = kept.upgrade() else {
                return;
            };
            let unused = {
                let mut slot = kept.slot();
                match slot.as_ref() {
                    Some(held) if held.number == number => slot.take(),
                    _ => None,
                }
            };
            if let Some(held) = unused.filter(|h| h.in_transaction) {
                let _ = Self::rollback(held).await;
            }
        });
    }

    /// A group done with `held` outside a transaction: kept while requests
    /// wait, else back to the pool.
    pub fn done(self: &Arc<Self>, held: Held) {
        if !held.in_transaction && self.wanted() {
            self.keep(held);
        }
    }

    /// Commit, unless the call's time limit gave it up first (then the
    /// connection is closed, which rolls it back). With requests waiting,
    /// the next group's transaction is opened in the same round trip.
    pub async fn commit(self: &Arc<Self>, mut held: Held) -> StoreResult<()> {
        commit_gate::may_commit()?;
        if self.wanted() {
            sqlx::raw_sql(COMMIT_AND_BEGIN).execute(&mut *held).await?;
            self.keep(held);
        } else {
            sqlx::raw_sql("COMMIT").execute(&mut *held).await?;
            held.in_transaction = false;
        }
        Ok(())
    }

    /// Roll back; the connection goes back to the pool when that worked.
    pub async fn rollback(mut held: Held) -> StoreResult<()> {
        sqlx::raw_sql("ROLLBACK").execute(&mut *held).await?;
        held.in_transaction = false;
        Ok(())
    }

    /// Commit after success; roll back at once after a failure.
    pub async fn finish<T>(self: &Arc<Self>, held: Held, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Ok(value) => {
                self.commit(held).await?;
                Ok(value)
            }
            Err(error) => {
                // A failed rollback closes the connection anyway.
                let _ = Self::rollback(held).await;
                Err(error)
            }
        }
    }
}

#[cfg(test)]
#[path = "kept_tests.rs"]
mod tests;
