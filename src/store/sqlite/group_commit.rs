//! Group commit on one thread. The writer owns the only writing connection
//! (synchronous, so a statement is a function call rather than a hand-off
//! between threads) and runs every write that is waiting in one transaction
//! with one durable commit. A write's answer is sent only after that commit,
//! so nothing is acknowledged that a crash could lose.
//!
//! Writes of the same kind (outcomes, enqueues, lease extensions, lease
//! releases) that queued together are merged into one set-based batch, so a
//! group costs a few statements per kind rather than a few per request. When
//! a merged batch fails as a whole (a row refused by a constraint, say), it
//! is rolled back and each request is run again on its own, so every request
//! gets the answer it would have got alone. Nothing waits to be merged: the
//! writer takes what is queued when it becomes free, so an idle server
//! writes a request at once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

mod thread;

use super::enqueue::EnqueueItem;
use super::lease::{ExtendItem, ReleaseItem};
use super::outcome::OutcomeItem;
use crate::domain::{Claimed, Route, StoreError};
use crate::store::{Enqueued, StoreResult};

/// Most requests merged into one commit.
const MAX_GROUP: usize = 512;
/// Most items (outcomes, receipts…) in one commit; a larger group waits.
const MAX_ITEMS: usize = 16_384;
/// After a group failed to begin or commit (the database locked by another
/// process, a full disk), background writes alone do not start a group for
/// this long: each would hold the writer for up to the busy timeout, and a
/// request queued behind it would wait twice as long for its answer. They
/// still ride along with requests' groups.
const BACKGROUND_PAUSE: Duration = Duration::from_secs(30);

/// A sender of the answer to one request, fired after the commit.
type Finish = Box<dyn FnOnce(Option<&StoreError>) + Send>;
/// A write that cannot be merged with others (claims, redrive, purge).
type Solo = Box<dyn FnOnce(&Connection) -> Finish + Send>;

/// Items of one request and where their answers go.
struct Batch<I, R> {
    items: Vec<I>,
    reply: oneshot::Sender<StoreResult<Vec<R>>>,
}

enum Job {
    Enqueue(Batch<EnqueueItem, Enqueued>),
    Outcomes(Batch<OutcomeItem, StoreResult<Route>>),
    Extend(Batch<ExtendItem, StoreResult<Claimed>>),
    Release(Batch<ReleaseItem, StoreResult<()>>),
    Solo(Solo),
    /// A solo write nobody waits on (the rates of `GET /v1/stats`).
    Background(Solo),
}

impl Job {
    fn size(&self) -> usize {
        match self {
            Self::Enqueue(b) => b.items.len(),
            Self::Outcomes(b) => b.items.len(),
            Self::Extend(b) => b.items.len(),
            Self::Release(b) => b.items.len(),
            Self::Solo(_) | Self::Background(_) => 1,
        }
    }
}

/// A handle that submits writes to the writer thread.
#[derive(Clone)]
pub struct Writer {
    jobs: mpsc::Sender<Job>,
    /// Requests answered from a merged batch, since start (tests read it).
    #[cfg_attr(not(test), allow(dead_code))]
    merged: Arc<AtomicU64>,
}

fn stopped() -> StoreError {
    StoreError::backend("the SQLite writer has stopped")
}

/// Open the writer connection with the durability the store promises.
pub fn open(path: &PathBuf) -> StoreResult<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL + synchronous=FULL: a commit is on disk before it is answered.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Savepoint and statement journals in memory: they only undo a part of
    // the group's own transaction (the WAL holds what is durable). In a
    // file, every statement of a group wrote each page it touched to it
    // once more: a `pwrite` per page, a third of the writer's time.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl Writer {
    /// Start the writer thread on the database at `path`.
    pub fn start(path: PathBuf) -> StoreResult<Self> {
        let conn = open(&path)?;
        let (tx, rx) = mpsc::channel(4096);
        let merged = Arc::new(AtomicU64::new(0));
        let counter = merged.clone();
        std::thread::Builder::new()
            .name("settled-sqlite-writer".into())
            .spawn(move || thread::run(Some(conn), &path, rx, &counter))
            .map_err(|e| StoreError::backend(format!("starting the writer: {e}")))?;
        Ok(Self { jobs: tx, merged })
    }

    /// Requests answered from a merged batch since start.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn merged_requests(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }

    /// Requests waiting for the writer (tests use it to know a group is queued).
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.jobs.max_capacity() - self.jobs.capacity()
    }

    async fn submit<T>(
        &self,
        job: Job,
        answer: oneshot::Receiver<StoreResult<T>>,
    ) -> StoreResult<T> {
        self.jobs.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Enqueue receipts (merged with other enqueues waiting).
    pub async fn enqueue(&self, items: Vec<EnqueueItem>) -> StoreResult<Vec<Enqueued>> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Enqueue(Batch { items, reply }), answer)
            .await
    }

    /// Record outcomes (merged with other outcomes waiting).
    pub async fn outcomes(&self, items: Vec<OutcomeItem>) -> StoreResult<Vec<StoreResult<Route>>> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Outcomes(Batch { items, reply }), answer)
            .await
    }

    /// Extend one lease (merged with other extensions waiting).
    pub async fn extend(&self, item: ExtendItem) -> StoreResult<Claimed> {
        let (reply, answer) = oneshot::channel();
        let batch = Batch {
            items: vec![item],
            reply,
        };
        one(self.submit(Job::Extend(batch), answer).await?)
    }

    /// Release one lease (merged with other releases waiting).
    pub async fn release(&self, item: ReleaseItem) -> StoreResult<()> {
        let (reply, answer) = oneshot::channel();
        let batch = Batch {
            items: vec![item],
            reply,
        };
        one(self.submit(Job::Release(batch), answer).await?)
    }

    /// Run `op` alone (in its own savepoint) in the next group commit.
    pub async fn solo<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (job, answer) = solo_job(op);
        self.submit(Job::Solo(job), answer).await
    }

    /// [`Self::solo`] for a background write: while the database is failing
    /// it is refused rather than run alone (see [`BACKGROUND_PAUSE`]).
    pub async fn background<F>(&self, op: F) -> StoreResult<()>
    where
        F: FnOnce(&Connection) -> StoreResult<()> + Send + 'static,
    {
        let (job, answer) = solo_job(op);
        self.jobs
            .send(Job::Background(job))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| {
            StoreError::backend("background write deferred: the database failed the last write")
        })?
    }
}

/// A solo job running `op`, and where its answer arrives.
fn solo_job<T, F>(op: F) -> (Solo, oneshot::Receiver<StoreResult<T>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let job: Solo = Box::new(move |conn| {
        let result = in_savepoint(conn, "solo", op);
        Box::new(move |failed: Option<&StoreError>| {
            let _ = reply.send(match failed {
                None => result,
                Some(e) => Err(e.clone()),
            });
        })
    });
    (job, answer)
}

fn lost() -> StoreError {
    StoreError::backend("SQLite rolled the group's transaction back")
}

fn one<T>(mut results: Vec<StoreResult<T>>) -> StoreResult<T> {
    results
        .pop()
        .unwrap_or_else(|| Err(StoreError::internal("no result")))
}

/// Run `op` in a savepoint: kept when it succeeds, undone when it fails or
/// panics (a bug in one write must not take the writer down with it).
pub(super) fn in_savepoint<T>(
    conn: &Connection,
    name: &str,
    op: impl FnOnce(&Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    // After a full disk or an I/O error SQLite may have rolled the whole
    // group back on its own; a savepoint opened now would start (and its
    // release commit) a transaction of its own, outside the group.
    if conn.is_autocommit() {
        return Err(lost());
    }
    // Cached statements: a savepoint per request must not cost a parse.
    conn.prepare_cached(&format!("SAVEPOINT {name}"))?
        .execute([])?;
    let result = catch_unwind(AssertUnwindSafe(|| op(conn)))
        .unwrap_or_else(|_| Err(StoreError::backend("a write panicked")));
    let run = |sql: String| conn.prepare_cached(&sql).and_then(|mut s| s.execute([]));
    if result.is_err() {
        // Fails only when the transaction is already gone, which the group
        // checks before it commits.
        let _ = run(format!("ROLLBACK TO {name}"));
    }
    if !conn.is_autocommit()
        && let Err(e) = run(format!("RELEASE {name}"))
    {
        // A request answered with an error must leave nothing behind.
        let _ = run(format!("ROLLBACK TO {name}"));
        let _ = run(format!("RELEASE {name}"));
        return Err(e.into());
    }
    result
}
