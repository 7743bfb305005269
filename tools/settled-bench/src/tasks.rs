//! The bench's tasks: work spread over a number of them, and joined.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{Res, err, progress};

/// Wait for every task; the first failure, if any (`what` names the tasks
/// in the message of one that panicked).
pub async fn join_all(tasks: &mut tokio::task::JoinSet<Res<()>>, what: &str) -> Res<()> {
    let mut first = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let result = joined
            .map_err(|e| err(format!("{what} failed: {e}")))
            .and_then(|r| r);
        if first.is_ok() {
            first = result;
        }
    }
    first
}

/// Run `job` over `0..n` in ranges of `chunk`, `workers` at a time, with a
/// progress line `label` of what the jobs counted done; the first failure.
pub async fn in_chunks<F, Fut>(
    n: usize,
    chunk: usize,
    workers: usize,
    label: &str,
    job: F,
) -> Res<()>
where
    F: Fn(std::ops::Range<usize>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Res<usize>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let shown = done.clone();
    let ticker = progress(
        label.to_owned(),
        n,
        Arc::new(move || (shown.load(Ordering::Relaxed), String::new())),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (next, done, job) = (next.clone(), done.clone(), job.clone());
        tasks.spawn(async move {
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n {
                    return Ok(());
                }
                done.fetch_add(job(start..n.min(start + chunk)).await?, Ordering::Relaxed);
            }
        });
    }
    let joined = join_all(&mut tasks, label).await;
    ticker.abort();
    joined
}
