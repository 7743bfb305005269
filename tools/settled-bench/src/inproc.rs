//! The same workload straight through the store, without HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use settled::domain::{ClaimLimit, GroupName, LeaseMs, ReceiptId, RetryPolicy, UnixMs, WorkerId};
use settled::store::postgres::{PostgresOptions, PostgresStore};
use settled::store::sqlite::SqliteStore;
use settled::store::{Enqueued, NewReceipt, ReceiptState, SharedStore};

use super::common::{Ids, Ledger, Res, err, now_ms, progress};
use super::tasks::{in_chunks, join_all};

/// The store's clock: the system's, as the server reads it.
fn now() -> UnixMs {
    UnixMs::saturating(now_ms())
}

/// Open a store of the backend the URL names.
pub async fn open(url: &str) -> Res<SharedStore> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else {
        Ok(PostgresStore::open(url, &PostgresOptions::default()).await?)
    }
}

/// Enqueue receipts `0..n` of `ids` in chunks of `chunk`, `producers` at a time.
/// Returns how many were refused (not created).
pub async fn enqueue(
    store: &SharedStore,
    ids: &Ids,
    n: usize,
    chunk: usize,
    producers: usize,
    visible_at_ms: Option<u64>,
    label: &str,
) -> Res<u64> {
    let refused = Arc::new(AtomicU64::new(0));
    let (store, ids, counted) = (store.clone(), ids.clone(), refused.clone());
    in_chunks(n, chunk, producers, label, move |range| {
        let (store, ids, refused) = (store.clone(), ids.clone(), counted.clone());
        async move {
            let receipts = range
                .map(|i| {
                    Ok(NewReceipt {
                        receipt_id: ReceiptId::parse(&ids.id(i))?,
                        finalized_at: Ids::finalized_at(i),
                        observation: Some(serde_json::json!({"amount_cents": i})),
                        visible_at_ms: visible_at_ms.map(UnixMs::saturating),
                        group: ids.group(i).map_or_else(
                            || Ok(GroupName::default_group()),
                            |g| GroupName::parse(&g),
                        )?,
                        priority: settled::domain::Priority::default(),
                        trace: None,
                    })
                })
                .collect::<Res<Vec<_>>>()?;
            let results = store.enqueue(&receipts, now()).await?;
            let ok = results.iter().filter(|r| **r == Enqueued::Created).count();
            refused.fetch_add((results.len() - ok) as u64, Ordering::Relaxed);
            Ok(ok)
        }
    })
    .await?;
    Ok(refused.load(Ordering::Relaxed))
}

/// What the in-process run measured.
pub struct InprocResult {
    pub enqueued_per_sec: f64,
    pub settled_per_sec: f64,
    pub elapsed_s: f64,
    pub failures: Vec<String>,
}

/// Settings shared by both runs.
#[derive(Clone)]
pub struct Workload {
    pub receipts: usize,
    pub preload: usize,
    pub enqueue_batch: usize,
    pub producers: usize,
    pub workers: usize,
    pub batch: usize,
    pub lease_ms: u64,
    pub mix: super::common::Mix,
    pub deadline: Duration,
    /// Receipts spread over this many groups (0: none named).
    pub groups: usize,
    /// HTTP workers send each batch's outcomes with their next claim.
    pub carry: bool,
}

/// Preload, enqueue and settle the workload on a fresh `store`.
pub async fn run(store: SharedStore, w: &Workload, policy: RetryPolicy) -> Res<InprocResult> {
    let mut failures = Vec::new();
    let run = super::common::run_id();
    if w.preload > 0 {
        let ids = Ids {
            prefix: format!("pre-{run}"),
            groups: 0,
        };
        let far = Some(super::common::far_future_ms());
        let (chunk, label) = (w.enqueue_batch.max(1), "in-process preload");
        enqueue(&store, &ids, w.preload, chunk, w.producers, far, label).await?;
    }
    let ids = Ids {
        prefix: format!("ip-{run}"),
        groups: w.groups,
    };
    let started = Instant::now();
    let (chunk, label) = (w.enqueue_batch.max(1), "in-process enqueue");
    let refused = enqueue(&store, &ids, w.receipts, chunk, w.producers, None, label).await?;
    let enqueued_per_sec = w.receipts as f64 / started.elapsed().as_secs_f64();
    if refused > 0 {
        failures.push(format!("in-process: {refused} receipts not created"));
    }

    let ledger = Arc::new(Ledger::new(w.receipts));
    let shown = ledger.clone();
    let ticker = progress(
        "in-process settle".into(),
        w.receipts,
        Arc::new(move || (shown.done.load(Ordering::Relaxed), String::new())),
    );
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..w.workers.max(1) {
        let (store, ids, ledger, w) = (store.clone(), ids.clone(), ledger.clone(), w.clone());
        tasks.spawn(async move { worker(store, ids, ledger, w, n, policy, started).await });
    }
    let joined = join_all(&mut tasks, "task").await;
    let elapsed = started.elapsed().as_secs_f64();
    ticker.abort();
    joined?;
    ledger.check(&mut failures, "in-process");
    let status = store.status(now(), 1).await?;
    let count = |s: ReceiptState| status.counts.get(s);
    let finished = count(ReceiptState::Settled)
        + count(ReceiptState::Skipped)
        + count(ReceiptState::DeadLettered);
    let active = count(ReceiptState::Leased) + count(ReceiptState::RetryScheduled);
    if finished != w.receipts as u64
        || active != 0
        || count(ReceiptState::Pending) != w.preload as u64
        || count(ReceiptState::Settled) != Ledger::get(&ledger.settled)
    {
        failures.push(format!(
            "in-process: store counts {:?} do not match the workload",
            status.counts
        ));
    }
    Ok(InprocResult {
        enqueued_per_sec,
        settled_per_sec: ledger.done.load(Ordering::Relaxed) as f64 / elapsed,
        elapsed_s: elapsed,
        failures,
    })
}

async fn worker(
    store: SharedStore,
    ids: Ids,
    ledger: Arc<Ledger>,
    w: Workload,
    n: usize,
    policy: RetryPolicy,
    started: Instant,
) -> Res<()> {
    let worker = WorkerId::parse(&format!("bench-inproc-{n}"))?;
    let lease = LeaseMs::try_from(w.lease_ms)?;
    let limit = ClaimLimit::try_from(w.batch)?;
    while !ledger.all_done() && started.elapsed() < w.deadline {
        let claims = match store.claim_due(&worker, now(), lease, limit).await {
            Ok(claims) => claims,
            Err(_) => {
                ledger.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if claims.is_empty() {
            ledger.empty_claims.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let mut items = Vec::with_capacity(claims.len());
        let mut meta = Vec::with_capacity(claims.len());
        for claimed in claims {
            let claim = claimed.claim;
            let Some(index) = ids.index(claim.receipt_id.as_str()) else {
                ledger.foreign.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let (kind, outcome) = w.mix.outcome(index, claim.attempts);
            let input = outcome
                .parse()
                .map_err(|_| err("the bench built an invalid outcome"))?;
            meta.push((index, kind));
            items.push((claim, input));
        }
        match store.record_claimed_outcomes(&items, policy, now()).await {
            Ok(results) => {
                for ((index, kind), result) in meta.into_iter().zip(results) {
                    match result {
                        Ok(route) => ledger.route(index, kind, &route),
                        Err(_) => {
                            ledger.conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            Err(_) => {
                ledger.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}
