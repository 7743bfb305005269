//! Groups named once and drained: one receipt in each of `n` groups,
//! enqueued and canceled before the run, so that the run's claims meet a
//! group table of `n` rows with nothing active in them, as a service with a
//! group per merchant does (docs/groups.md, "Many groups").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{Ids, Res, err, join_all, progress};
use crate::http::Api;

/// Most ids one `POST /v1/bulk/cancel` names.
const CANCEL_CHUNK: usize = 1000;

/// Name `n` groups (`g0000`, `g0001`, …; the run's own groups are among
/// them) with one receipt each, then cancel every one of those receipts.
pub async fn name_and_drain(api: &Api, run: &str, n: usize, producers: usize) -> Res<()> {
    let ids = Ids {
        prefix: format!("idle-{run}"),
        groups: n,
    };
    let label = "idle groups: enqueue (HTTP)";
    let refused = api.enqueue(&ids, n, 1024, producers, None, label).await?;
    if refused > 0 {
        return Err(err(format!(
            "idle groups: {refused} receipts were not created"
        )));
    }
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let shown = done.clone();
    let ticker = progress(
        "idle groups: cancel (HTTP)".to_owned(),
        n,
        Arc::new(move || (shown.load(Ordering::Relaxed), String::new())),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..producers.max(1) {
        let (api, ids, next, done) = (api.clone(), ids.clone(), next.clone(), done.clone());
        tasks.spawn(async move {
            loop {
                let start = next.fetch_add(CANCEL_CHUNK, Ordering::Relaxed);
                if start >= n {
                    return Ok::<_, crate::common::BenchError>(());
                }
                let names: Vec<String> = (start..n.min(start + CANCEL_CHUNK))
                    .map(|i| ids.id(i))
                    .collect();
                let body = serde_json::json!({"receipt_ids": names, "reason": "drain idle groups"});
                let (status, bytes) = api.post("/v1/bulk/cancel", &body).await?;
                if status != 200 {
                    return Err(err(format!(
                        "POST /v1/bulk/cancel: {status}: {}",
                        String::from_utf8_lossy(&bytes)
                    )));
                }
                done.fetch_add(names.len(), Ordering::Relaxed);
            }
        });
    }
    let joined = join_all(&mut tasks, "canceller").await;
    ticker.abort();
    joined
}
