//! The claim queue's transactions. While requests wait behind a group, the
//! group's `COMMIT` and the next group's `BEGIN` go to the database as one
//! query, on a connection the queue keeps until it runs dry: a group is one
//! round trip shorter (its outcomes, the groups' walk, the claim and the
//! commit), which is what a one-by-one claim waits for
//! (docs/perf-log/postgres-write-path.md, "Where a one-by-one claim's time
//! goes"). The open transaction has no snapshot and holds no lock until the
//! next group's first statement.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use super::batcher::Backlog;
use super::commit_gate;
use super::primary::Primary;
use super::tx::{BEGIN_CLAIM, COMMIT_AND_BEGIN};
use crate::store::StoreResult;
use crate::store::fair::Turn;

/// How long a transaction opened for the next group waits for it, at most.
/// A group that was expected but did not come (its requests given up)
/// leaves it unused: it is then rolled back and its connection goes back to
/// the pool, so that no connection sits idle in a transaction, which
/// monitoring flags, and none is used after the server may have ended it
/// (`idle_in_transaction_session_timeout`, which settled sets to the
/// statement timeout: half of that when it is shorter).
const KEEP_AT_MOST: Duration = Duration::from_secs(1);

/// What the claims of one replica share.
pub(super) struct Claiming {
    /// Where this replica's next claim's turn over the groups starts after.
    pub turn: Turn,
    /// A connection inside a claim transaction opened for the next group.
    next: Mutex<Option<Open>>,
    primary: Arc<Primary>,
    backlog: Backlog,
    /// Numbers the transactions opened for a next group.
    opened: AtomicU64,
    /// How long one waits for its group ([`KEEP_AT_MOST`]).
    keep_for: Duration,
}

/// A pooled connection inside a claim transaction. Dropped so (a failure, a
/// call given up), it is closed instead of going back to the pool, where the
/// next borrower's statements would run inside the transaction.
pub(super) struct Open {
    conn: Option<PoolConnection<Postgres>>,
    /// Taken from the pool after this: a connection the writer's change
    /// fenced since is not used (src/store/postgres/primary.rs).
    since: Instant,
    /// Which transaction opened for a next group this is (0: none), and when.
    number: u64,
    opened_at: Instant,
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.close_on_drop();
        }
    }
}

impl Deref for Open {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_deref()
            .expect("an open transaction has its connection")
    }
}

impl DerefMut for Open {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("an open transaction has its connection")
    }
}

impl Open {
    /// Out of the transaction: the connection goes back to the pool.
    fn release(mut self) {
        drop(self.conn.take());
    }
}

impl Claiming {
    /// `statement_timeout`: the pool's, `Duration::ZERO` when off.
    pub fn new(primary: Arc<Primary>, backlog: Backlog, statement_timeout: Duration) -> Self {
        let keep_for = match statement_timeout / 2 {
            Duration::ZERO => KEEP_AT_MOST,
            half => half.min(KEEP_AT_MOST),
        };
        Self {
            keep_for,
            turn: Turn::default(),
            next: Mutex::new(None),
            primary,
            backlog,
            opened: AtomicU64::new(0),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Option<Open>> {
        self.next.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A claim transaction: the one opened with the last commit, or a new one.
    pub async fn begin(&self, pool: &PgPool) -> StoreResult<Open> {
        let kept = self.kept().take();
        if let Some(open) = kept {
            // Else dropped: the connection is closed.
            if open.opened_at.elapsed() < self.keep_for
                && !self.primary.fenced(open.since.elapsed())
            {
                return Ok(open);
            }
        }
        let since = Instant::now();
        let mut open = Open {
            conn: Some(pool.acquire().await?),
            since,
            number: 0,
            opened_at: since,
        };
        sqlx::raw_sql(BEGIN_CLAIM).execute(&mut *open).await?;
        Ok(open)
    }

    /// Commit, unless the call's time limit gave it up first (then the
    /// connection is closed, which rolls it back). With requests waiting,
    /// the next group's transaction is opened in the same round trip.
    pub async fn commit(self: &Arc<Self>, mut open: Open) -> StoreResult<()> {
        commit_gate::may_commit()?;
        if self.backlog.waiting() && self.kept().is_none() {
            sqlx::raw_sql(COMMIT_AND_BEGIN).execute(&mut *open).await?;
            open.number = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
            open.opened_at = Instant::now();
            let (number, keep_for) = (open.number, self.keep_for);
            // Another task's kept transaction, if one got there first, is
            // closed with the one it replaces.
            drop(self.kept().replace(open));
            let claiming = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(keep_for).await;
                let Some(claiming) = claiming.upgrade() else {
                    return;
                };
                let unused = {
                    let mut kept = claiming.kept();
                    match kept.as_ref() {
                        Some(open) if open.number == number => kept.take(),
                        _ => None,
                    }
                };
                if let Some(open) = unused {
                    let _ = claiming.rollback(open).await;
                }
            });
        } else {
            sqlx::raw_sql("COMMIT").execute(&mut *open).await?;
            open.release();
        }
        Ok(())
    }

    /// Roll back; the connection goes back to the pool when that worked.
    pub async fn rollback(&self, mut open: Open) -> StoreResult<()> {
        sqlx::raw_sql("ROLLBACK").execute(&mut *open).await?;
        open.release();
        Ok(())
    }

    /// Commit after success; roll back at once after a failure.
    pub async fn finish<T>(self: &Arc<Self>, open: Open, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Ok(value) => {
                self.commit(open).await?;
                Ok(value)
            }
            Err(error) => {
                // A failed rollback closes the connection anyway.
                let _ = self.rollback(open).await;
                Err(error)
            }
        }
    }
}

#[cfg(test)]
#[path = "claim_tx_tests.rs"]
mod tests;
