//! Turns across replicas. The first runner of each write queue takes its
//! queue's PostgreSQL advisory lock before it gathers a group, so that the
//! replicas on one database run their groups of a kind one at a time, and
//! each group takes in whatever queued on its replica while the others ran:
//! with several replicas the database still gets few, large statements and
//! commits instead of many small ones (docs/scaling.md). A turn is waited
//! for at most [`LOCK_WAIT`]; then the group runs without it, as it would
//! with no other replica. A replica alone on its database takes no turns
//! (they would cost two statements a group): each turn connection holds a
//! shared lock that says it is there, and the others are counted once a
//! second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;

/// The first key of a queue's turn lock is this plus the queue's kind; the
/// second names the schema, so that deployments in schemas of their own
/// (`--pg-schema`) in one database take no turns with each other.
const CLASS: i32 = 0x5e77_0000;

/// Longest wait for a turn, on the database's clock (`lock_timeout`).
const LOCK_WAIT: &str = "SET lock_timeout = '20ms'";

/// Longest wait for an answer about a turn before the connection is given
/// up (a database that went away).
const ANSWER_WAIT: Duration = Duration::from_millis(500);

/// How often a replica counts the others of its queue.
const COUNT_EVERY: Duration = Duration::from_secs(1);

/// The first key of the shared lock that says a queue's turn connection is
/// there: [`CLASS`] plus this plus the queue's kind.
const PRESENT: i32 = 100;

/// Which queue of which schema the turns are for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Queue {
    kind: i32,
    schema: i32,
}

impl Queue {
    /// Queue `kind` (a small number, one per kind of write) of `schema`.
    pub fn new(kind: i32, schema: &str) -> Self {
        Self {
            kind,
            schema: super::schema::lock_key(schema),
        }
    }

    /// The turn lock's keys.
    fn turn(self) -> (i32, i32) {
        (CLASS + self.kind, self.schema)
    }

    /// The keys of the shared lock that says a turn connection is there.
    fn present(self) -> (i32, i32) {
        (CLASS + PRESENT + self.kind, self.schema)
    }
}

/// A turn connection is opened afresh this often, so that it follows the
/// pool to a new primary after a failover.
const RECYCLE: Duration = Duration::from_secs(30);

/// The turns of one queue of one replica, on a connection of their own
/// (taken out of the pool: its lock timeout is its own).
pub(super) struct Turns {
    pool: PgPool,
    queue: Queue,
    conn: Option<(PgConnection, Instant)>,
    /// A turn connection being opened, off the groups' path: waiting for
    /// a busy pool's next connection held the first runner's request.
    opening: Option<JoinHandle<Option<PgConnection>>>,
    /// Whether another replica's queue of this kind was there, and when
    /// that was counted.
    others: Option<(bool, Instant)>,
    leading: Arc<AtomicBool>,
}

impl Turns {
    /// `leading`: whether this replica takes the others' writes now (they
    /// send it theirs, src/store/postgres/upkeep.rs), when it takes no turns.
    pub fn new(pool: PgPool, queue: Queue, leading: Arc<AtomicBool>) -> Self {
        Self {
            pool,
            queue,
            leading,
            conn: None,
            opening: None,
            others: None,
        }
    }

    /// Wait for this queue's turn: whether it was taken (then it must be
    /// given back).
    pub async fn take(&mut self) -> bool {
        if self.leading.load(Ordering::Relaxed) {
            return false;
        }
        self.follow_opening().await;
        if !self.others_there().await {
            return false;
        }
        let Some((conn, _)) = self.conn.as_mut() else {
            return false;
        };
        let (class, object) = self.queue.turn();
        let lock = sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(class)
            .bind(object)
            .execute(conn);
        match tokio::time::timeout(ANSWER_WAIT, lock).await {
            Ok(Ok(_)) => true,
            // Another replica's group ran longer than the wait: run anyway.
            Ok(Err(sqlx::Error::Database(e))) if e.code().as_deref() == Some("55P03") => false,
            _ => {
                self.conn = None;
                false
            }
        }
    }

    /// Give the turn back (a connection that cannot is closed, which does).
    pub async fn give_back(&mut self) {
        let Some((conn, _)) = self.conn.as_mut() else {
            return;
        };
        let (class, object) = self.queue.turn();
        let unlock = sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(class)
            .bind(object)
            .execute(conn);
        if !matches!(tokio::time::timeout(ANSWER_WAIT, unlock).await, Ok(Ok(_))) {
            self.conn = None;
        }
    }

    /// Whether another replica's queue of this kind is there (counted at
    /// most once a [`COUNT_EVERY`]).
    async fn others_there(&mut self) -> bool {
        if let Some((others, at)) = self.others
            && at.elapsed() < COUNT_EVERY
        {
            return others;
        }
        let Some((conn, _)) = self.conn.as_mut() else {
            return false;
        };
        let (class, object) = self.queue.present();
        let count = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = $1 AND objid = $2 AND objsubid = 2",
        )
        .bind(class)
        .bind(object)
        .fetch_one(conn);
        match tokio::time::timeout(ANSWER_WAIT, count).await {
            Ok(Ok(n)) => {
                self.others = Some((n > 1, Instant::now()));
                n > 1
            }
            _ => {
                self.conn = None;
                false
            }
        }
    }

    /// Start opening a turn connection when there is none or it is due to
    /// be recycled (closed first: a replica holds one per queue, as the
    /// documented connection count says); take one that has opened. Waits
    /// for nothing: meanwhile groups run without turns.
    async fn follow_opening(&mut self) {
        if let Some(opened) = self.opening.take_if(|t| t.is_finished()) {
            // Finished: this answers at once.
            if let Ok(Some(conn)) = opened.await {
                self.conn = Some((conn, Instant::now()));
            }
            return;
        }
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > RECYCLE)
        {
            self.conn = None;
        }
        if self.conn.is_none() && self.opening.is_none() {
            self.opening = Some(tokio::spawn(open(self.pool.clone(), self.queue)));
        }
    }
}

impl Drop for Turns {
    fn drop(&mut self) {
        if let Some(opening) = &self.opening {
            opening.abort();
        }
    }
}

/// A connection of `pool`'s, out of it, that says it is there for `queue`;
/// `None` when the pool or the database did not answer in time.
async fn open(pool: PgPool, queue: Queue) -> Option<PgConnection> {
    let pooled = tokio::time::timeout(ANSWER_WAIT, pool.acquire())
        .await
        .ok()?
        .ok()?;
    let mut conn = pooled.detach();
    let set = sqlx::query(LOCK_WAIT).execute(&mut conn);
    if !matches!(tokio::time::timeout(ANSWER_WAIT, set).await, Ok(Ok(_))) {
        return None;
    }
    let (class, object) = queue.present();
    let present = sqlx::query("SELECT pg_advisory_lock_shared($1, $2)")
        .bind(class)
        .bind(object)
        .execute(&mut conn);
    matches!(tokio::time::timeout(ANSWER_WAIT, present).await, Ok(Ok(_))).then_some(conn)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Queue, Turns};
    use crate::store::postgres::test_support::fresh_store;

    /// A new turn connection takes no group's time: `turns` is made to
    /// open one, and this waits until it is there.
    async fn opened(turns: &mut Turns) -> &mut Turns {
        let deadline = Instant::now() + Duration::from_secs(30);
        turns.follow_opening().await;
        while turns.conn.is_none() {
            assert!(Instant::now() < deadline, "no turn connection opened");
            tokio::time::sleep(Duration::from_millis(5)).await;
            turns.follow_opening().await;
        }
        turns
    }

    /// Two replicas' queues of one kind take turns; another kind does not
    /// wait for them; a turn held too long is waited for only briefly; a
    /// replica alone takes none.
    #[tokio::test]
    async fn replicas_take_turns_and_never_wait_long() {
        let Some((_url, store)) = fresh_store().await else {
            return;
        };
        let pool = store.pool.clone();
        // The store's own queues are there too: keys of their own here.
        let mut a = Turns::new(
            pool.clone(),
            Queue::new(11, "settled"),
            std::sync::Arc::default(),
        );
        assert!(!a.take().await, "nothing waits for a turn connection");
        assert!(
            !opened(&mut a).await.take().await,
            "alone, no turn is taken"
        );
        let mut b = Turns::new(
            pool.clone(),
            Queue::new(11, "settled"),
            std::sync::Arc::default(),
        );
        assert!(
            opened(&mut b).await.take().await,
            "with another there, a turn is taken"
        );
        assert!(!a.take().await, "a counted itself alone within the second");
        a.others = None;
        let started = Instant::now();
        assert!(!a.take().await, "a turn held elsewhere is not taken");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the wait is bounded"
        );
        b.give_back().await;
        assert!(a.take().await, "a turn given back is taken");
        let mut other = Turns::new(
            pool.clone(),
            Queue::new(12, "settled"),
            std::sync::Arc::default(),
        );
        assert!(!opened(&mut other).await.take().await);
        let mut third = Turns::new(
            pool.clone(),
            Queue::new(12, "settled"),
            std::sync::Arc::default(),
        );
        assert!(
            opened(&mut third).await.take().await,
            "another queue's turn is its own"
        );
        third.give_back().await;
        a.give_back().await;
        // A turn connection that is gone is opened again.
        a.conn = None;
        a.others = None;
        assert!(opened(&mut a).await.take().await);
        a.give_back().await;
        // A deployment in another schema of the same database is not another
        // replica: its queues take no turns with these.
        let mut elsewhere = Turns::new(
            pool.clone(),
            Queue::new(11, "elsewhere"),
            std::sync::Arc::default(),
        );
        assert!(
            !opened(&mut elsewhere).await.take().await,
            "another schema's queue is alone"
        );
        drop(elsewhere);
        // While this replica takes the others' writes, it takes no turn,
        // free as it is.
        a.leading.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            !a.take().await,
            "a replica taking the others' writes takes no turn"
        );
        a.leading.store(false, std::sync::atomic::Ordering::Relaxed);
        // With every pooled connection busy, a group does not wait for one.
        let mut held = Vec::new();
        while let Ok(Ok(conn)) =
            tokio::time::timeout(Duration::from_millis(200), pool.acquire()).await
        {
            held.push(conn);
        }
        let mut starved = Turns::new(
            pool.clone(),
            Queue::new(13, "settled"),
            std::sync::Arc::default(),
        );
        let started = Instant::now();
        assert!(!starved.take().await);
        assert!(
            started.elapsed() < Duration::from_millis(250),
            "waited {:?} for a connection",
            started.elapsed()
        );
        drop(held);
        assert!(opened(&mut starved).await.conn.is_some());
        drop(b);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            a.others = None;
            if !a.take().await {
                break;
            }
            a.give_back().await;
            assert!(Instant::now() < deadline, "alone again once the other left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
