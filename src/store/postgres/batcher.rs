//! Coalescing of concurrent writes on one replica. Outcomes, extensions and
//! releases go through one queue, batch claims through another, each served
//! by a few tasks running one group at a time on its own pooled connection.
//! An idle task takes a request at once, so a lone write waits for nothing; requests that queue while every
//! task is busy are merged into one group, which costs the statements (and
//! the commit) of one.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use super::commit_gate::{self, Gate};
use crate::domain::StoreError;
use crate::store::StoreResult;

/// A request that can be merged with others of its kind.
pub(super) trait Mergeable: Send + Sized + 'static {
    type Answer: Send + 'static;

    /// How many items it carries, to bound a group.
    fn size(&self) -> usize;

    /// Run a group; the answers in order, and whether work became due.
    fn run(
        pool: &PgPool,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Self::Answer>>, bool)> + Send;
}

/// Most items merged into one group; a single larger request still runs
/// alone. Bounds the statement's size and the time a group holds its locks.
const GROUP_ITEMS: usize = 1024;

struct Request<J: Mergeable> {
    job: J,
    reply: oneshot::Sender<StoreResult<J::Answer>>,
    /// Entered when a runner takes the request: from then on its caller
    /// waits for the group's answer, which the group's own bound keeps
    /// short unless its commit was sent. Given up by a caller still queued.
    taken: Arc<Gate>,
}

/// A queue of one store; its tasks end when the store is dropped.
pub(super) struct Batcher<J: Mergeable> {
    queue: mpsc::UnboundedSender<Request<J>>,
    bound: Option<Duration>,
}

impl<J: Mergeable> Batcher<J> {
    /// Start `tasks` group runners on `pool`. `bound` limits a group like any
    /// store call; `notify` is signalled after a group made work due.
    pub fn start(pool: PgPool, tasks: usize, bound: Option<Duration>, notify: Arc<Notify>) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let requests = Arc::new(Mutex::new(requests));
        for _ in 0..tasks.max(1) {
            tokio::spawn(serve(pool.clone(), requests.clone(), bound, notify.clone()));
        }
        Self { queue, bound }
    }

    /// Run `job`, merged with whatever else is waiting, within the bound:
    /// given up while it waits in the queue, never once a group took it
    /// (the group is given up as a whole before its commit, or answers).
    pub async fn run(&self, job: J) -> StoreResult<J::Answer> {
        let (reply, answer) = oneshot::channel();
        let taken = Arc::new(Gate::default());
        self.queue
            .send(Request {
                job,
                reply,
                taken: taken.clone(),
            })
            .map_err(|_| StoreError::backend("the write queue has stopped"))?;
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

/// Take the next request, waiting for it, and every request already queued
/// behind it, up to [`GROUP_ITEMS`].
async fn next_group<J: Mergeable>(
    requests: &Mutex<mpsc::UnboundedReceiver<Request<J>>>,
) -> Option<Vec<Request<J>>> {
    let mut requests = requests.lock().await;
    let first = requests.recv().await?;
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
    Some(group)
}

async fn serve<J: Mergeable>(
    pool: PgPool,
    requests: Arc<Mutex<mpsc::UnboundedReceiver<Request<J>>>>,
    bound: Option<Duration>,
    notify: Arc<Notify>,
) {
    while let Some(group) = next_group(&requests).await {
        // A caller that gave up (its call timed out or its client left) is
        // not written for; the others now wait for this group's answer.
        let (jobs, replies): (Vec<J>, Vec<_>) = group
            .into_iter()
            .filter(|r| !r.reply.is_closed() && r.taken.enter())
            .map(|r| (r.job, r.reply))
            .unzip();
        if jobs.is_empty() {
            continue;
        }
        let (answers, wakes) = run_contained(&pool, jobs, bound).await;
        if wakes {
            notify.notify_waiters();
        }
        for (reply, answer) in replies.into_iter().zip(answers) {
            // The caller may have gone since; its answer is then dropped.
            let _ = reply.send(answer);
        }
    }
}

/// Run one group on its own task, so that a panic in it (a bug) answers its
/// callers with an error instead of ending this queue's runner.
async fn run_contained<J: Mergeable>(
    pool: &PgPool,
    jobs: Vec<J>,
    bound: Option<Duration>,
) -> (Vec<StoreResult<J::Answer>>, bool) {
    let count = jobs.len();
    let failed = |e: StoreError| ((0..count).map(|_| Err(e.clone())).collect(), false);
    let pool = pool.clone();
    // Aborting the task before its commit cancels its statement and rolls
    // it back; after, the commit's answer is the group's.
    commit_gate::spawned_within(
        bound,
        async move { J::run(&pool, &jobs).await },
        || failed(StoreError::backend("a write failed unexpectedly")),
        failed,
    )
    .await
}
