//! Lease races: many workers whose leases are shorter than their work, on a
//! real server with the system clock. A commit sent after its lease deadline
//! is always refused with 409 `lease_conflict`; one answered before it always
//! commits; and every receipt is settled exactly once.
//!
//! Small by default; `SETTLED_LONG=1` runs ten times as many receipts.

use crate::common;

use crate::common::LEASE_LOST;
use crate::common::rng::{Rng, now_ms};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use settled::clock::SystemClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use tokio::sync::watch;

use crate::common::Fresh;

const WORKERS: usize = 16;

#[derive(Default)]
struct Tally {
    committed: AtomicU64,
    conflicts: AtomicU64,
    late_refused: AtomicU64,
    on_time_committed: AtomicU64,
    undecided: AtomicU64,
    /// 200 answers to `accepted` outcomes, per receipt.
    accepted: Mutex<BTreeMap<String, u32>>,
    /// (receipt, attempt, outcome, worker) of every 200.
    acks: Mutex<Vec<(String, u64, &'static str, String)>>,
}

async fn worker(
    name: String,
    base: String,
    done: Arc<AtomicBool>,
    mut rng: Rng,
    tally: Arc<Tally>,
) {
    let http = reqwest::Client::new();
    while !done.load(Ordering::Relaxed) {
        let lease_ms = 100 + rng.below(101);
        let limit = 1 + rng.below(3);
        let answer = http
            .post(format!("{base}/v1/claims"))
            .json(&json!({"worker_id": name, "lease_ms": lease_ms, "limit": limit, "wait_ms": 100}))
            .send()
            .await
            .expect("claim");
        assert_eq!(answer.status(), 200);
        let body: Value = answer.json().await.expect("claims");
        // The batch is worked one claim after another, so later ones run late.
        for claim in body["claims"].as_array().expect("claims") {
            tokio::time::sleep(Duration::from_millis(rng.below(401))).await;
            let id = claim["receipt_id"].as_str().expect("id").to_owned();
            let attempts = claim["attempts"].as_u64().expect("attempts");
            let until = claim["lease_until_ms"].as_u64().expect("until");
            let (outcome, kind) = if attempts == 0 && rng.below(5) == 0 {
                (
                    json!({"kind": "retryable", "code": "rpc", "detail": "rail timeout"}),
                    "retryable",
                )
            } else {
                (
                    json!({"kind": "accepted", "transcript_id": format!("tx-{id}-{name}")}),
                    "accepted",
                )
            };
            let sent_at = now_ms();
            let answer = http
                .post(format!("{base}/v1/receipts/{id}/outcome"))
                .json(&json!({"claim": claim, "outcome": outcome}))
                .send()
                .await
                .expect("outcome");
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.expect("outcome body");
            let answered_at = now_ms();
            match status {
                200 => {
                    tally.committed.fetch_add(1, Ordering::Relaxed);
                    assert!(
                        sent_at < until,
                        "{id}: a commit sent at {sent_at}, after its lease deadline {until}, was accepted: {body}"
                    );
                    if answered_at < until {
                        tally.on_time_committed.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tally.undecided.fetch_add(1, Ordering::Relaxed);
                    }
                    if kind == "accepted" {
                        assert_eq!(body["kind"], "no_action");
                        *tally
                            .accepted
                            .lock()
                            .unwrap()
                            .entry(id.clone())
                            .or_default() += 1;
                    } else {
                        assert_eq!(body["kind"], "retry_scheduled");
                    }
                    tally
                        .acks
                        .lock()
                        .unwrap()
                        .push((id, attempts + 1, kind, name.clone()));
                }
                409 => {
                    assert!(
                        LEASE_LOST.contains(&body["code"].as_str().unwrap_or_default()),
                        "{body}"
                    );
                    assert_eq!(body["class"], "conflict", "{body}");
                    tally.conflicts.fetch_add(1, Ordering::Relaxed);
                    assert!(
                        answered_at >= until,
                        "{id}: refused although the lease (until {until}) was live for the whole request ({sent_at}..{answered_at}): {body}"
                    );
                    if sent_at >= until {
                        tally.late_refused.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tally.undecided.fetch_add(1, Ordering::Relaxed);
                    }
                }
                other => panic!("{id}: unexpected {other}: {body}"),
            }
        }
    }
}

async fn races(fresh: Fresh) {
    let started = Instant::now();
    let n: usize = if std::env::var_os("SETTLED_LONG").is_some() {
        2000
    } else {
        200
    };
    let mut rng = Rng::from_env();
    let policy = RetryPolicy::new(32, 20, 1, 20).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        policy,
        Arc::new(SystemClock),
        rx.clone(),
    );
    let mut stopped = rx;
    let server = tokio::spawn(settled::server::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let http = reqwest::Client::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let receipts: Vec<Value> = chunk
            .iter()
            .map(
                |i| json!({"receipt_id": format!("race-{i:05}"), "finalized_at": 1_764_460_800u64}),
            )
            .collect();
        let answer = http
            .post(format!("{base}/v1/receipts/batch"))
            .json(&json!({ "receipts": receipts }))
            .send()
            .await
            .expect("enqueue");
        assert_eq!(answer.status(), 200);
    }

    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            tokio::spawn(worker(
                format!("w{w:02}"),
                base.clone(),
                done.clone(),
                rng.fork(),
                tally.clone(),
            ))
        })
        .collect();
    // Give up only when the settled count stops moving for 15 s.
    let mut last_settled = 0;
    let mut last_progress = Instant::now();
    loop {
        let status: Value = http
            .get(format!("{base}/v1/status?limit=1"))
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("status json");
        let settled = status["counts"]["settled"].as_u64().expect("settled");
        if settled == n as u64 {
            break;
        }
        if settled > last_settled {
            last_settled = settled;
            last_progress = Instant::now();
        }
        assert!(
            workers.iter().all(|w| !w.is_finished()),
            "a worker stopped early"
        );
        assert!(
            last_progress.elapsed() < Duration::from_secs(15),
            "no progress: {}",
            status["counts"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let accepted = tally.accepted.lock().unwrap().clone();
    let acks = tally.acks.lock().unwrap().clone();
    assert_eq!(accepted.len(), n, "every receipt accepted once over HTTP");
    assert!(
        accepted.values().all(|&c| c == 1),
        "a receipt was acknowledged as accepted twice"
    );
    for i in 0..n {
        let id = format!("race-{i:05}");
        let view: Value = http
            .get(format!("{base}/v1/receipts/{id}"))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("view");
        assert_eq!(view["state"], "settled", "{view}");
        let history = view["history"].as_array().expect("history");
        let accepted = history
            .iter()
            .filter(|h| h["outcome"] == "accepted")
            .count();
        assert_eq!(accepted, 1, "settled exactly once: {view}");
        for (_, attempt, kind, worker) in acks.iter().filter(|a| a.0 == id) {
            assert!(
                history
                    .iter()
                    .any(|h| h["attempt"].as_u64() == Some(*attempt)
                        && h["outcome"] == *kind
                        && h["worker_id"] == worker.as_str()),
                "acknowledged ({attempt}, {kind}, {worker}) missing: {view}"
            );
        }
        // Nothing but acknowledged outcomes reached the history.
        assert_eq!(
            history.len(),
            acks.iter().filter(|a| a.0 == id).count(),
            "{view}"
        );
    }
    let _ = stop.send(true);
    server.await.expect("server task").expect("server");
    let late_refused = tally.late_refused.load(Ordering::Relaxed);
    assert!(
        late_refused > 0,
        "leases shorter than the work must produce late commits"
    );
    println!(
        "lease_races ({}): receipts {n}, workers {WORKERS}, commits {}, conflicts {} \
         (late commits refused {late_refused}), on-time commits {}, too close to call {}, {:.1} s",
        fresh.store.backend().as_str(),
        tally.committed.load(Ordering::Relaxed),
        tally.conflicts.load(Ordering::Relaxed),
        tally.on_time_committed.load(Ordering::Relaxed),
        tally.undecided.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_late_commits_are_refused_and_each_receipt_settles_once() {
    let _turn = crate::turn(module_path!());
    races(common::fresh_sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_late_commits_are_refused_and_each_receipt_settles_once() {
    let _turn = crate::turn(module_path!());
    if let Some(fresh) = common::fresh_postgres().await {
        races(fresh).await;
    }
}
