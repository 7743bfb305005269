//! Crash recovery: the real binary under load is killed with SIGKILL at random
//! moments and restarted on the same database. Nothing acknowledged is lost,
//! nothing is settled twice, and work leased at the crash comes back once its
//! lease expires.
//!
//! Small by default (5 kills); `SETTLED_LONG=1` runs 25 kills with more load.
//! Runs on SQLite, and on PostgreSQL when `SETTLED_TEST_POSTGRES_URL` is set.

use crate::common;

use crate::common::LEASE_LOST;
use crate::common::process::{Launch, Server};
use crate::common::rng::{Rng, now_ms};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

mod load;

use load::*;

/// Lease length the workers ask for: short, so orphaned leases expire quickly.
const LEASE_MS: u64 = 500;
/// A retryable outcome is reported only while a receipt has fewer attempts
/// than this, so every receipt eventually settles.
const MAX_RPC_FAILURES: u64 = 2;

fn long() -> bool {
    std::env::var_os("SETTLED_LONG").is_some()
}

/// The binary on `url` with the `extra` flags; of a run under long load it
/// keeps the first 1000 log lines.
fn start(dir: &Path, url: &str, extra: &[&str]) -> Server {
    Launch::new(dir)
        .database(url)
        .args(extra)
        .keep_at_most(1000)
        .spawn()
        .ready()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("client")
}

/// One outcome a worker saw acknowledged with 200.
#[derive(Debug, Clone)]
struct Ack {
    receipt_id: String,
    attempt: u64,
    outcome: &'static str,
    worker_id: String,
    transcript_id: Option<String>,
    route: String,
}

#[derive(Default)]
struct Figures {
    acked_outcomes: AtomicU64,
    conflicts: AtomicU64,
    lost_answers: AtomicU64,
    unexpected: Mutex<Vec<String>>,
}

/// The current server address; `None` while it is down.
type Address = watch::Receiver<Option<String>>;

async fn current(address: &mut Address) -> String {
    loop {
        if let Some(base) = address.borrow_and_update().clone() {
            return base;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), address.changed()).await;
    }
}

async fn crash_and_recover(url: String, dir: &Path) {
    let started = Instant::now();
    let mut rng = Rng::from_env();
    let kills = if long() { 25 } else { 5 };
    let workers = if long() { 8 } else { 4 };
    let batch = if long() { 15 } else { 10 };
    // Retries come due quickly and never run out, so everything settles.
    let policy = [
        "--max-retries",
        "32",
        "--initial-backoff-ms",
        "50",
        "--backoff-multiplier",
        "1",
        "--backoff-cap-ms",
        "50",
    ];
    let (publish, address) = watch::channel(None::<String>);
    let stop_producing = Arc::new(AtomicBool::new(false));
    let stop_working = Arc::new(AtomicBool::new(false));
    let acked_receipts = Arc::new(Mutex::new(BTreeSet::new()));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let figures = Arc::new(Figures::default());
    let producing = tokio::spawn(producer(
        address.clone(),
        stop_producing.clone(),
        batch,
        acked_receipts.clone(),
        figures.clone(),
    ));
    let mut working = Vec::new();
    for w in 0..workers {
        working.push(tokio::spawn(worker(
            format!("worker-{w}"),
            address.clone(),
            stop_working.clone(),
            rng.fork(),
            acks.clone(),
            figures.clone(),
        )));
    }
    let http = client();
    let mut orphans = 0usize;
    let mut killed_at = None;
    for _ in 0..kills {
        let server = start(dir, &url, &policy);
        if let Some(at) = killed_at {
            let reclaimed = reclaim_orphans(&http, &server.base, at).await;
            orphans += reclaimed.len();
            acks.lock().unwrap().extend(reclaimed);
        }
        publish.send_replace(Some(server.base.clone()));
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        publish.send_replace(None);
        let status = server.kill();
        assert!(!status.success(), "killed, not exited: {status}");
        killed_at = Some(Instant::now());
    }
    // Last run: stop producing (its last batch is acknowledged first), then let
    // the workers finish everything.
    let server = start(dir, &url, &policy);
    let reclaimed = reclaim_orphans(
        &http,
        &server.base,
        killed_at.expect("killed at least once"),
    )
    .await;
    orphans += reclaimed.len();
    acks.lock().unwrap().extend(reclaimed);
    publish.send_replace(Some(server.base.clone()));
    stop_producing.store(true, Ordering::Relaxed);
    producing.await.expect("producer");
    let receipts = acked_receipts.lock().unwrap().clone();
    // Drain: give up only when the settled count stops moving for 15 s.
    let mut last_settled = 0;
    let mut last_progress = Instant::now();
    let counts = loop {
        let status = get(&http, format!("{}/v1/status?limit=1", server.base)).await;
        let counts = status["counts"].clone();
        let open: u64 = ["pending", "leased", "retry_scheduled"]
            .iter()
            .map(|k| counts[k].as_u64().expect("count"))
            .sum();
        if open == 0 {
            break counts;
        }
        let settled = counts["settled"].as_u64().expect("settled");
        if settled > last_settled {
            last_settled = settled;
            last_progress = Instant::now();
        }
        assert!(
            last_progress.elapsed() < Duration::from_secs(15),
            "no progress in the final run: {counts}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop_working.store(true, Ordering::Relaxed);
    for w in working {
        w.await.expect("worker");
    }

    // Everything acknowledged was kept, and everything settled exactly once.
    let unexpected = figures.unexpected.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    let total = receipts.len() as u64;
    assert!(total > 0, "the producer got nothing acknowledged");
    assert_eq!(
        counts,
        json!({"pending": 0, "scheduled": 0, "held": 0, "leased": 0, "retry_scheduled": 0, "settled": total,
               "skipped": 0, "dead_lettered": 0, "canceled": 0}),
        "every acknowledged receipt settled, and nothing else exists"
    );
    let mut by_receipt: BTreeMap<String, Vec<Ack>> = BTreeMap::new();
    for ack in acks.lock().unwrap().iter() {
        assert!(
            receipts.contains(&ack.receipt_id),
            "outcome for an unknown receipt {ack:?}"
        );
        by_receipt
            .entry(ack.receipt_id.clone())
            .or_default()
            .push(ack.clone());
    }
    let mut accepted_acks = 0usize;
    for id in &receipts {
        let view = get(&http, format!("{}/v1/receipts/{id}", server.base)).await;
        assert_eq!(view["state"], "settled", "{view}");
        let history = view["history"].as_array().expect("history");
        let accepted: Vec<&Value> = history
            .iter()
            .filter(|h| h["outcome"] == "accepted")
            .collect();
        assert_eq!(accepted.len(), 1, "exactly one accepted entry: {view}");
        assert_eq!(view["transcript_id"], accepted[0]["transcript_id"]);
        for ack in by_receipt.get(id).map(Vec::as_slice).unwrap_or_default() {
            let found = history.iter().any(|h| {
                h["attempt"].as_u64() == Some(ack.attempt)
                    && h["outcome"] == ack.outcome
                    && h["worker_id"] == ack.worker_id.as_str()
                    && h["route"] == ack.route.as_str()
                    && ack
                        .transcript_id
                        .as_ref()
                        .is_none_or(|t| h["transcript_id"] == t.as_str())
            });
            assert!(
                found,
                "acknowledged {ack:?} missing from the history: {view}"
            );
            if ack.outcome == "accepted" {
                accepted_acks += 1;
            }
        }
    }
    assert!(
        accepted_acks <= receipts.len(),
        "more accepted acknowledgements than receipts"
    );
    server.stop();
    println!(
        "crash_recovery ({}): receipts {total}, kills {kills}, acknowledged outcomes {}, \
         conflicts {}, lost answers (resent) {}, abandoned leases reclaimed after restarts {orphans}, {:.1} s",
        if url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        },
        figures.acked_outcomes.load(Ordering::Relaxed) + orphans as u64,
        figures.conflicts.load(Ordering::Relaxed),
        figures.lost_answers.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill_under_load() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite:{}", dir.path().join("settled.db").display());
    crash_and_recover(url, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_sigkill_under_load() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    crash_and_recover(url, dir.path()).await;
}
