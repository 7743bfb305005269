//! The write queue's grouping, without a database.

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
    type Shared = ();

    fn size(&self) -> usize {
        self.size
    }

    fn run(
        _: &PgPool,
        _: &Arc<()>,
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
    Arc::new(Batcher::start(
        pool,
        tasks,
        None,
        Arc::new(Notify::new()),
        None,
        |_| (),
    ))
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

type Answered = tokio::task::JoinHandle<StoreResult<()>>;

/// A one-item request whose group runs until `gate` opens, once it runs.
async fn first_group_held(
    batcher: &Arc<Batcher<Fake>>,
    log: &Arc<Log>,
) -> (Arc<Semaphore>, Answered) {
    let gate = Arc::new(Semaphore::new(0));
    let first = tokio::spawn({
        let b = batcher.clone();
        let j = job(log, 1, Some(&gate));
        async move { b.run(j).await }
    });
    until(|| log.running.load(Ordering::SeqCst) == 1).await;
    (gate, first)
}

/// Small requests that queue behind a running group wait for it and
/// then run together as one group: the second runner stays idle.
#[tokio::test]
async fn small_requests_queue_and_merge_behind_one_group() {
    let (batcher, log) = (start(2), Arc::new(Log::default()));
    let (gate, first) = first_group_held(&batcher, &log).await;
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
    let (gate, first) = first_group_held(&batcher, &log).await;
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

/// Items counted but not in the queue (the first task holds a large request
/// while it waits for its turn across replicas) leave the other runners
/// asleep: looking again and again for them spun a core for the whole wait.
#[tokio::test]
async fn a_counted_request_the_first_task_holds_costs_no_cpu() {
    let (batcher, log) = (start(2), Arc::new(Log::default()));
    // The first task busy (it does not wait on the queue meanwhile).
    let (gate, first) = first_group_held(&batcher, &log).await;
    batcher
        .waiting
        .items
        .fetch_add(SPLIT_ITEMS, Ordering::SeqCst);
    batcher.waiting.crowded.notify_one();
    // This runtime runs on this thread alone: its CPU is the runners'.
    let before = thread_cpu_ticks();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spent = thread_cpu_ticks() - before;
    assert!(
        spent < 5,
        "{spent} ticks of CPU (1/100 s) over 300 ms asleep"
    );
    batcher
        .waiting
        .items
        .fetch_sub(SPLIT_ITEMS, Ordering::SeqCst);
    gate.add_permits(1);
    first.await.expect("task").expect("answered");
}

/// User and system CPU of this thread so far, in clock ticks.
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
    // The fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split(' ')
        .collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}
