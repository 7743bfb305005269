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
    items: AtomicUsize,
    /// Told when `items` reaches [`SPLIT_ITEMS`], and when the queue closes.
    crowded: Notify,
    closed: AtomicBool,
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
    /// store call; `notify` is signalled after a group made work due.
    pub fn start(pool: PgPool, tasks: usize, bound: Option<Duration>, notify: Arc<Notify>) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let waiting = Arc::new(Waiting {
            requests: Mutex::new(requests),
            items: AtomicUsize::new(0),
            crowded: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(serve(pool.clone(), waiting.clone(), bound, notify.clone()));
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

/// Take the next request (waiting for it when `wait`, else `None` when
/// none is queued) and every request already queued behind it, up to
/// [`GROUP_ITEMS`].
async fn next_group<J: Mergeable>(waiting: &Waiting<J>, wait: bool) -> Option<Vec<Request<J>>> {
    let mut requests = waiting.requests.lock().await;
    let first = if wait {
        requests.recv().await?
    } else {
        requests.try_recv().ok()?
    };
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
    Some(group)
}

/// The first task: every request, as it comes.
async fn serve<J: Mergeable>(
    pool: PgPool,
    waiting: Arc<Waiting<J>>,
    bound: Option<Duration>,
    notify: Arc<Notify>,
) {
    while let Some(group) = next_group(&waiting, true).await {
        run_group(&pool, group, bound, &notify).await;
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
        if let Some(group) = next_group(&waiting, false).await {
            run_group(&pool, group, bound, &notify).await;
        }
    }
}

/// Run one group and answer its callers.
async fn run_group<J: Mergeable>(
    pool: &PgPool,
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
    let (answers, wakes) = run_contained(pool, jobs, bound).await;
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
        || failed(StoreError::internal("a write task panicked")),
        failed,
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as Locked;

    use tokio::sync::Semaphore;

    use super::*;

    /// What the groups of a queue did.
    #[derive(Default)]
    struct Log {
        /// Each group's job sizes, in the order the groups started.
        groups: Locked<Vec<Vec<usize>>>,
        running: AtomicUsize,
        /// Most groups running at once.
        most: AtomicUsize,
    }

    /// A job of `size` items; its group waits for `hold` to open, if any.
    struct Fake {
        size: usize,
        log: Arc<Log>,
        hold: Option<Arc<Semaphore>>,
    }

    impl Mergeable for Fake {
        type Answer = ();

        fn size(&self) -> usize {
            self.size
        }

        fn run(
            _: &PgPool,
            jobs: &[Self],
        ) -> impl Future<Output = (Vec<StoreResult<()>>, bool)> + Send {
            let log = jobs[0].log.clone();
            let holds: Vec<_> = jobs.iter().filter_map(|j| j.hold.clone()).collect();
            log.groups
                .lock()
                .expect("log")
                .push(jobs.iter().map(|j| j.size).collect());
            let count = jobs.len();
            async move {
                let now = log.running.fetch_add(1, Ordering::SeqCst) + 1;
                log.most.fetch_max(now, Ordering::SeqCst);
                for hold in holds {
                    let _ = hold.acquire().await;
                }
                log.running.fetch_sub(1, Ordering::SeqCst);
                ((0..count).map(|_| Ok(())).collect(), false)
            }
        }
    }

    fn start(tasks: usize) -> Arc<Batcher<Fake>> {
        let pool = PgPool::connect_lazy("postgres://127.0.0.1:1/unused").expect("lazy pool");
        Arc::new(Batcher::start(pool, tasks, None, Arc::new(Notify::new())))
    }

    fn job(log: &Arc<Log>, size: usize, hold: Option<&Arc<Semaphore>>) -> Fake {
        Fake {
            size,
            log: log.clone(),
            hold: hold.cloned(),
        }
    }

    /// Yield until `ready` holds (the runners are tasks on this runtime).
    async fn until(ready: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !ready() {
            assert!(tokio::time::Instant::now() < deadline, "timed out");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Small requests that queue behind a running group wait for it and
    /// then run together as one group: the second runner stays idle.
    #[tokio::test]
    async fn small_requests_queue_and_merge_behind_one_group() {
        let (batcher, log) = (start(2), Arc::new(Log::default()));
        let gate = Arc::new(Semaphore::new(0));
        let first = tokio::spawn({
            let b = batcher.clone();
            let j = job(&log, 1, Some(&gate));
            async move { b.run(j).await }
        });
        until(|| log.running.load(Ordering::SeqCst) == 1).await;
        let rest: Vec<_> = (0..10)
            .map(|_| {
                let (b, j) = (batcher.clone(), job(&log, 1, None));
                tokio::spawn(async move { b.run(j).await })
            })
            .collect();
        until(|| batcher.waiting.items.load(Ordering::SeqCst) == 10).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            log.groups.lock().expect("log").len(),
            1,
            "nothing ran beside the first"
        );
        gate.add_permits(1);
        first.await.expect("task").expect("answered");
        for r in rest {
            r.await.expect("task").expect("answered");
        }
        assert_eq!(*log.groups.lock().expect("log"), [vec![1], vec![1; 10]]);
        assert_eq!(log.most.load(Ordering::SeqCst), 1);
    }

    /// A backlog of [`SPLIT_ITEMS`] items runs beside a group that is still
    /// running, and is answered before it.
    #[tokio::test]
    async fn a_large_backlog_runs_beside_the_first_group() {
        let (batcher, log) = (start(2), Arc::new(Log::default()));
        let gate = Arc::new(Semaphore::new(0));
        let first = tokio::spawn({
            let b = batcher.clone();
            let j = job(&log, 1, Some(&gate));
            async move { b.run(j).await }
        });
        until(|| log.running.load(Ordering::SeqCst) == 1).await;
        let backlog = batcher.run(job(&log, SPLIT_ITEMS, None));
        tokio::time::timeout(Duration::from_secs(30), backlog)
            .await
            .expect("answered while the first group still runs")
            .expect("answered");
        assert_eq!(log.most.load(Ordering::SeqCst), 2);
        gate.add_permits(1);
        first.await.expect("task").expect("answered");
    }

    /// Dropping the queue ends every runner, the idle ones too.
    #[tokio::test]
    async fn dropping_the_queue_ends_its_runners() {
        let batcher = start(4);
        let waiting = batcher.waiting.clone();
        batcher
            .run(job(&Arc::default(), 1, None))
            .await
            .expect("answered");
        drop(batcher);
        until(|| Arc::strong_count(&waiting) == 1).await;
    }
}
