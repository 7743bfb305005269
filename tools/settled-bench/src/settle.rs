//! HTTP workers: claim a batch, report its outcomes, until every receipt of
//! the run is finished.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use settled::domain::Route;
use settled::http::wire::{ClaimBody as Claim, OutcomeIn};

use super::common::{Ids, Kind, Latencies, Ledger, Pacer, Res, err};
use super::http::Api;
use super::inproc::Workload;

#[derive(Deserialize)]
struct ClaimsBody {
    claims: Vec<Claim>,
}

#[derive(Serialize)]
struct Item<'a> {
    claim: &'a Claim,
    outcome: OutcomeIn,
}

/// A batch of outcomes as `POST /v1/outcomes` takes it, serialized as it
/// stands (through `serde_json::json!` each item became a map first: the
/// bench's own allocations, on the cores the server and PostgreSQL use).
#[derive(Serialize)]
struct OutcomesBody<'a> {
    outcomes: &'a [Item<'a>],
}

#[derive(Deserialize)]
struct ItemResult {
    route: Option<Route>,
    error: Option<Problem>,
}

#[derive(Deserialize)]
struct Problem {
    class: Option<String>,
}

#[derive(Deserialize)]
struct ResultsBody {
    results: Vec<ItemResult>,
}

/// Latencies of one worker.
#[derive(Default)]
pub struct WorkerStats {
    pub claim: Latencies,
    pub outcome: Latencies,
}

/// Run `w.workers` HTTP workers until the ledger is full or the deadline
/// passes, worker `n` on `apis[n % apis.len()]`.
pub async fn run(
    apis: &[Api],
    ids: &Ids,
    ledger: &Arc<Ledger>,
    w: &Workload,
    pacer: Option<Arc<Pacer>>,
) -> Res<WorkerStats> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..w.workers.max(1) {
        let api = apis[n % apis.len()].clone();
        let (ids, ledger, w) = (ids.clone(), ledger.clone(), w.clone());
        let pacer = pacer.clone();
        if w.carry {
            tasks.spawn(async move { carrying(api, ids, ledger, w, n, pacer, started).await });
        } else {
            tasks.spawn(async move { worker(api, ids, ledger, w, n, pacer, started).await });
        }
    }
    let mut all = WorkerStats::default();
    let mut first = Ok(());
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| err(format!("worker failed: {e}"))) {
            Ok(Ok(stats)) => {
                all.claim.merge(stats.claim);
                all.outcome.merge(stats.outcome);
            }
            Ok(Err(e)) | Err(e) => {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    first?;
    Ok(all)
}

async fn worker(
    api: Api,
    ids: Ids,
    ledger: Arc<Ledger>,
    w: Workload,
    n: usize,
    pacer: Option<Arc<Pacer>>,
    started: Instant,
) -> Res<WorkerStats> {
    let mut stats = WorkerStats::default();
    let request = serde_json::json!({
        "worker_id": format!("bench-http-{n}"),
        "lease_ms": w.lease_ms,
        "limit": w.batch,
    });
    while !ledger.all_done() && started.elapsed() < w.deadline {
        if let Some(pacer) = &pacer {
            pacer.take(w.batch).await;
        }
        let t0 = Instant::now();
        let answer = api.post("/v1/claims", &request).await;
        stats.claim.push(t0.elapsed());
        let claims = match answer {
            Ok((200, bytes)) => serde_json::from_slice::<ClaimsBody>(&bytes)?.claims,
            _ => {
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
        for claim in &claims {
            let Some(index) = ids.index(&claim.receipt_id) else {
                give_back(&api, &ledger, claim).await;
                continue;
            };
            let (kind, outcome) = w.mix.outcome(index, claim.attempts);
            meta.push((index, kind));
            items.push(Item { claim, outcome });
        }
        if items.is_empty() {
            continue;
        }
        let t0 = Instant::now();
        if w.batch == 1 {
            let item = &items[0];
            let path = format!("/v1/receipts/{}/outcome", item.claim.receipt_id);
            let answer = api.post(&path, item).await;
            stats.outcome.push(t0.elapsed());
            one(&ledger, meta[0], answer)?;
        } else {
            let answer = api
                .post("/v1/outcomes", &OutcomesBody { outcomes: &items })
                .await;
            stats.outcome.push(t0.elapsed());
            batch(&ledger, &meta, answer)?;
        }
    }
    Ok(stats)
}

/// A claim that carries the outcomes of the worker's last batch.
#[derive(Serialize)]
struct CarryingClaim<'a> {
    worker_id: &'a str,
    lease_ms: u64,
    limit: usize,
    outcomes: &'a [Item<'a>],
}

#[derive(Deserialize)]
struct CarriedBody {
    claims: Vec<Claim>,
    #[serde(default)]
    results: Vec<ItemResult>,
}

/// A worker that reports each batch's outcomes in its next claim request:
/// one request per batch. Its claim latency is that whole round trip.
async fn carrying(
    api: Api,
    ids: Ids,
    ledger: Arc<Ledger>,
    w: Workload,
    n: usize,
    pacer: Option<Arc<Pacer>>,
    started: Instant,
) -> Res<WorkerStats> {
    let mut stats = WorkerStats::default();
    let worker_id = format!("bench-http-{n}");
    let mut held: Vec<Claim> = Vec::new();
    let mut meta: Vec<(usize, Kind)> = Vec::new();
    while (!ledger.all_done() || !held.is_empty()) && started.elapsed() < w.deadline {
        if let Some(pacer) = &pacer {
            pacer.take(w.batch).await;
        }
        let items: Vec<Item<'_>> = held
            .iter()
            .zip(&meta)
            .map(|(claim, &(index, _))| Item {
                claim,
                outcome: w.mix.outcome(index, claim.attempts).1,
            })
            .collect();
        let body = CarryingClaim {
            worker_id: &worker_id,
            lease_ms: w.lease_ms,
            limit: w.batch,
            outcomes: &items,
        };
        let t0 = Instant::now();
        let answer = api.post("/v1/claims", &body).await;
        stats.claim.push(t0.elapsed());
        let answer = match answer {
            Ok((200, bytes)) => serde_json::from_slice::<CarriedBody>(&bytes)?,
            _ => {
                // Nothing is known of the outcomes: send them again.
                ledger.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        drop(items);
        if answer.results.len() != meta.len() {
            return Err(err(
                "POST /v1/claims answered a different number of results",
            ));
        }
        record(&ledger, &meta, answer.results);
        held.clear();
        meta.clear();
        if answer.claims.is_empty() {
            ledger.empty_claims.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        for claim in answer.claims {
            let Some(index) = ids.index(&claim.receipt_id) else {
                give_back(&api, &ledger, &claim).await;
                continue;
            };
            meta.push((index, w.mix.outcome(index, claim.attempts).0));
            held.push(claim);
        }
    }
    Ok(stats)
}

/// Someone else's work on a shared server: give it straight back.
async fn give_back(api: &Api, ledger: &Ledger, claim: &Claim) {
    ledger.foreign.fetch_add(1, Ordering::Relaxed);
    let path = format!("/v1/receipts/{}/lease", claim.receipt_id);
    let _ = api
        .delete(&path, &serde_json::json!({ "claim": claim }))
        .await;
}

fn one(ledger: &Ledger, (index, kind): (usize, Kind), answer: Res<(u16, Vec<u8>)>) -> Res<()> {
    match answer {
        Ok((200, bytes)) => {
            let route: Route = serde_json::from_slice(&bytes)?;
            ledger.route(index, kind, &route);
        }
        Ok((409, _)) => {
            ledger.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            ledger.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn batch(ledger: &Ledger, meta: &[(usize, Kind)], answer: Res<(u16, Vec<u8>)>) -> Res<()> {
    let Ok((200, bytes)) = answer else {
        ledger.errors.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    };
    let body: ResultsBody = serde_json::from_slice(&bytes)?;
    if body.results.len() != meta.len() {
        return Err(err(
            "POST /v1/outcomes answered a different number of results",
        ));
    }
    record(ledger, meta, body.results);
    Ok(())
}

/// Count each item's result.
fn record(ledger: &Ledger, meta: &[(usize, Kind)], results: Vec<ItemResult>) {
    for (&(index, kind), result) in meta.iter().zip(results) {
        match (result.route, result.error) {
            (Some(route), _) => ledger.route(index, kind, &route),
            (None, Some(p)) if p.class.as_deref() == Some("conflict") => {
                ledger.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                ledger.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
