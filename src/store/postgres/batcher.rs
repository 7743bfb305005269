//! Coalescing of concurrent writes on one replica. Outcomes, extensions and
//! releases go through one queue, batch claims through another, each served
//! by a few tasks running one group at a time on its own pooled connection.
//! The first task takes a request at once, so a lone write waits for nothing;
//! requests that queue while it is busy are merged into one group, which
//! costs the statements (and the commit) of one. The other tasks run groups
//! only while at least [`SPLIT_ITEMS`] items wait: many small requests
//! (one receipt each) then merge into few statements, while large ones
//! (batches of hundreds) still run side by side on the database's cores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use super::commit_gate::{self, Gate};
use super::turns::{Queue, Turns};
use crate::domain::StoreError;
use crate::store::StoreResult;

/// A request that can be merged with others of its kind.
pub(super) trait Mergeable: Send + Sized + 'static {
    type Answer: Send + 'static;
    /// What the queue's groups share (its kept connection, say).
    type Shared: Send + Sync + 'static;

    /// How many items it carries, to bound a group.
    fn size(&self) -> usize;

    /// Run a group; the answers in order, and whether work became due.
    fn run(
        pool: &PgPool,
        shared: &Arc<Self::Shared>,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Self::Answer>>, bool)> + Send;
}

/// Most items merged into one group; a single larger request still runs
/// alone. Bounds the statement's size and the time a group holds its locks.
const GROUP_ITEMS: usize = 1024;

/// Items waiting that let a second group run beside the first. Measured on
/// a 2-core database: one-by-one requests (at most one per worker waiting)
/// settle fastest in one group at a time; batches of 256 in two.
const SPLIT_ITEMS: usize = 256;

struct Request<J: Mergeable> {
    job: J,
    reply: oneshot::Sender<StoreResult<J::Answer>>,
    /// Entered when a runner takes the request: from then on its caller
    /// waits for the group's answer, which the group's own bound keeps
    /// short unless its commit was sent. Given up by a caller still queued.
    taken: Arc<Gate>,
}

/// What a queue's tasks share.
struct Waiting<J: Mergeable> {
    requests: Mutex<mpsc::UnboundedReceiver<Request<J>>>,
    /// Items sent and not yet taken into a group.
    items: Arc<AtomicUsize>,
    /// Told when `items` reaches [`SPLIT_ITEMS`], and when the queue closes.
    crowded: Notify,
    closed: AtomicBool,
    shared: Arc<J::Shared>,
}

/// Whether a queue has requests waiting to be taken into a group.
pub(super) struct Backlog(Arc<AtomicUsize>);

impl Backlog {
    pub fn waiting(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// A queue of one store; its tasks end when the store is dropped.
pub(super) struct Batcher<J: Mergeable> {
    queue: mpsc::UnboundedSender<Request<J>>,
    waiting: Arc<Waiting<J>>,
    bound: Option<Duration>,
}

impl<J: Mergeable> Drop for Batcher<J> {
    fn drop(&mut self) {
        // The first task ends with the channel; the others are told.
        self.waiting.closed.store(true, Ordering::SeqCst);
        self.waiting.crowded.notify_waiters();
    }
}

impl<J: Mergeable> Batcher<J> {
    /// Start `tasks` group runners on `pool`. `bound` limits a group like any
    /// store call; `notify` is signalled after a group made work due;
    /// `shared`, given the queue's backlog, makes what its groups share.
    pub fn start(
        pool: PgPool,
        tasks: usize,
        bound: Option<Duration>,
        notify: Arc<Notify>,
        turns: Option<(Queue, Arc<AtomicBool>)>,
        shared: impl FnOnce(Backlog) -> J::Shared,
    ) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let items = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(shared(Backlog(items.clone())));
        let waiting = Arc::new(Waiting {
            requests: Mutex::new(requests),
            items,
            crowded: Notify::new(),
            closed: AtomicBool::new(false),
            shared,
        });
        let turns = turns.map(|(queue, leading)| Turns::new(pool.clone(), queue, leading));
        tokio::spawn(serve(
            pool.clone(),
            waiting.clone(),
            bound,
            notify.clone(),
            turns,
        ));
        for _ in 1..tasks {
            tokio::spawn(serve_crowded(
                pool.clone(),
                waiting.clone(),
                bound,
                notify.clone(),
            ));
        }
        Self {
            queue,
            waiting,
            bound,
        }
    }

    /// What the queue's groups share.
    #[cfg(test)]
    pub fn shared(&self) -> &Arc<J::Shared> {
        &self.waiting.shared
    }

    /// Run `job`, merged with whatever else is waiting, within the bound:
    /// given up while it waits in the queue, never once a group took it
    /// (the group is given up as a whole before its commit, or answers).
    pub async fn run(&self, job: J) -> StoreResult<J::Answer> {
        let (reply, answer) = oneshot::channel();
        let taken = Arc::new(Gate::default());
        // Counted before it can be taken (and uncounted), so never below zero.
        let size = job.size();
        let items = self.waiting.items.fetch_add(size, Ordering::SeqCst) + size;
        self.queue
            .send(Request {
                job,
                reply,
                taken: taken.clone(),
            })
            .map_err(|_| StoreError::backend("the write queue has stopped"))?;
        if items >= SPLIT_ITEMS {
            self.waiting.crowded.notify_one();
        }
        let stopped = |_| Err(StoreError::backend("the write queue has stopped"));
        let Some(bound) = self.bound else {
            return answer.await.unwrap_or_else(stopped);
        };
        tokio::pin!(answer);
        tokio::select! {
            answered = &mut answer => answered.unwrap_or_else(stopped),
            () = tokio::time::sleep(bound) => {
                if taken.abandon() {
                    Err(commit_gate::too_late())
                } else {
                    answer.await.unwrap_or_else(stopped)
                }
            }
        }
    }
}

/// Take the next request queued (`None` when none is) and every request
/// already queued behind it, up to [`GROUP_ITEMS`].
async fn next_group<J: Mergeable>(waiting: &Waiting<J>) -> Option<Vec<Request<J>>> {
    let first = waiting.requests.lock().await.try_recv().ok()?;
    Some(gather(waiting, first).await)
}

/// `first` and every request queued behind it, up to [`GROUP_ITEMS`].
async fn gather<J: Mergeable>(waiting: &Waiting<J>, first: Request<J>) -> Vec<Request<J>> {
    let mut requests = waiting.requests.lock().await;
    let mut size = first.job.size();
    let mut group = vec![first];
    while size < GROUP_ITEMS {
        match requests.try_recv() {
            Ok(request) => {
                size += request.job.size();
                group.push(request);
            }
            Err(_) => break,
        }
    }
    waiting.items.fetch_sub(size, Ordering::SeqCst);
    group
}

/// The first task: every request, as it comes; with `turns`, a group is
/// gathered once the queue's turn across replicas is taken.
async fn serve<J: Mergeable>(
    pool: PgPool,
    waiting: Arc<Waiting<J>>,
    bound: Option<Duration>,
    notify: Arc<Notify>,
    mut turns: Option<Turns>,
) {
    loop {
        let first = waiting.requests.lock().await.recv().await;
        let Some(first) = first else {
            return;
        };
        let turn = match turns.as_mut() {
            Some(turns) => turns.take().await,
            None => false,
        };
        let group = gather(&waiting, first).await;
        run_group(&pool, &waiting.shared, group, bound, &notify).await;
        if let (true, Some(turns)) = (turn, turns.as_mut()) {
            turns.give_back().await;
        }
    }
}

/// Another task: groups while [`SPLIT_ITEMS`] items wait, until the queue
/// closes.
async fn serve_crowded<J: Mergeable>(
    pool: PgPool,
    waiting: Arc<Waiting<J>>,
    bound: Option<Duration>,
    notify: Arc<Notify>,
) {
    loop {
        let told = waiting.crowded.notified();
        tokio::pin!(told);
        // Listening before looking, so that no signal falls in between.
        told.as_mut().enable();
        if waiting.closed.load(Ordering::SeqCst) {
            return;
        }
        if waiting.items.load(Ordering::SeqCst) < SPLIT_ITEMS {
            told.await;
            continue;
        }
        match next_group(&waiting).await {
            Some(group) => run_group(&pool, &waiting.shared, group, bound, &notify).await,
            // Counted and not queued: held by the first task while it waits
            // for its turn, or about to be sent. Looking again at once would
            // spin a core for as long; the next send that crowds tells.
            None => told.await,
        }
    }
}

/// Run one group and answer its callers.
async fn run_group<J: Mergeable>(
    pool: &PgPool,
    shared: &Arc<J::Shared>,
    group: Vec<Request<J>>,
    bound: Option<Duration>,
    notify: &Notify,
) {
    // A caller that gave up (its call timed out or its client left) is
    // not written for; the others now wait for this group's answer.
    let (jobs, replies): (Vec<J>, Vec<_>) = group
        .into_iter()
        .filter(|r| !r.reply.is_closed() && r.taken.enter())
        .map(|r| (r.job, r.reply))
        .unzip();
    if jobs.is_empty() {
        return;
    }
    let (answers, wakes) = run_contained(pool, shared, jobs, bound).await;
    if wakes {
        notify.notify_waiters();
    }
    for (reply, answer) in replies.into_iter().zip(answers) {
        // The caller may have gone since; its answer is then dropped.
        let _ = reply.send(answer);
    }
}

/// Run one group on its own task, so that a panic in it (a bug) answers its
/// callers with an error instead of ending this queue's runner.
async fn run_contained<J: Mergeable>(
    pool: &PgPool,
    shared: &Arc<J::Shared>,
    jobs: Vec<J>,
    bound: Option<Duration>,
) -> (Vec<StoreResult<J::Answer>>, bool) {
    let count = jobs.len();
    let failed = |e: StoreError| ((0..count).map(|_| Err(e.clone())).collect(), false);
    let (pool, shared) = (pool.clone(), shared.clone());
    // Aborting the task before its commit cancels its statement and rolls
    // it back; after, the commit's answer is the group's.
    commit_gate::spawned_within(
        bound,
        async move { J::run(&pool, &shared, &jobs).await },
        || failed(StoreError::internal("a write task panicked")),
        failed,
    )
    .await
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
