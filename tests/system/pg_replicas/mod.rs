//! Several real `settled` processes on one PostgreSQL database: workers race
//! over HTTP with short leases and slow commits, and every rule still holds
//! across the replicas: nothing lost, nothing accepted twice, every late
//! commit refused, one store binding, and wakeups that cross replicas.
//!
//! Runs when `SETTLED_TEST_POSTGRES_URL` names a PostgreSQL server; prints
//! SKIPPED and passes otherwise.

use crate::common;
use crate::common::LEASE_LOST;
use crate::common::process::{Launch, Server};
use crate::common::rng::now_ms;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const RECEIPTS: usize = 2_000;
const ENQUEUE_BATCH: usize = 100;
const REPLICAS: usize = 3;
const WORKERS_PER_REPLICA: usize = 8;
const LEASE_MS: u64 = 400;
/// Workers "settle" for a random 0..=SLOWEST_COMMIT_MS before reporting, so
/// that about a third of the leases run out while their worker works.
const SLOWEST_COMMIT_MS: u64 = 600;
const WAIT_MS: u64 = 1_000;
/// How far a replica's clock may step between a claim and its commit. Replicas
/// keep PostgreSQL's clock from samples whose round trip is at most 50 ms, so
/// each sample is off by up to 25 ms and a resync may move the clock by up to
/// 50 ms (docs/concepts.md, "Lease"); the rest is room for a slow first sample.
/// A commit counts as in time or late only when it is so by more than this.
const CLOCK_TOLERANCE_MS: u64 = 100;
const MAX_RETRIES: u32 = 3;
/// The whole workload must finish well inside this.
const WORKLOAD_BOUND: Duration = Duration::from_secs(50);

/// Start `n` replicas at once (they migrate the same fresh database
/// concurrently); their log lines, but for the listening one, are shown.
async fn start_replicas(dir: &std::path::Path, n: usize, args: &[&str]) -> Vec<Server> {
    start_replicas_as(dir, n, args, false).await
}

/// [`start_replicas`]; with `advertise`, each on a port picked first, which
/// it advertises (`--advertise-url`) so that the others send it their
/// workers' writes while it does the upkeep.
async fn start_replicas_as(
    dir: &std::path::Path,
    n: usize,
    args: &[&str],
    advertise: bool,
) -> Vec<Server> {
    let starting: Vec<_> = (0..n)
        .map(|_| {
            let mut launch = Launch::new(dir).args(args).echo();
            if advertise {
                let address =
                    settled_test_support::process::free_loopback_address().expect("a free port");
                launch = launch
                    .listen(&address)
                    .args(&["--advertise-url", &format!("http://{address}")]);
            }
            launch.spawn()
        })
        .collect();
    let mut replicas = Vec::new();
    for replica in starting {
        replicas.push(replica.ready_async().await);
    }
    replicas
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{url}: not JSON ({e})"))
    };
    (status, body)
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    send(client, reqwest::Method::GET, url, None).await
}

pub(crate) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    send(client, reqwest::Method::POST, url, Some(body)).await
}

/// Enqueue `receipts` at `base` in one batch; each must be created. How many
/// were.
pub(crate) async fn enqueue_batch(
    client: &reqwest::Client,
    base: &str,
    receipts: Vec<Value>,
) -> usize {
    let (status, body) = post(
        client,
        &format!("{base}/v1/receipts/batch"),
        &json!({"receipts": receipts}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().expect("results");
    for result in results {
        assert_eq!(result["status"], "created", "{result}");
    }
    results.len()
}

mod forwarding;
mod rail;
mod workers;

use rail::*;
use workers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_settle_every_receipt_once_under_racing_workers() {
    racing_workers(false).await;
}

/// The same workload with the replicas advertising their URLs: the workers'
/// writes go to the replica doing the upkeep, whichever replica they reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_send_writes_on_settle_every_receipt_once_under_racing_workers() {
    racing_workers(true).await;
}

async fn racing_workers(advertise: bool) {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = replica_args(&url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = start_replicas_as(dir.path(), REPLICAS, &args, advertise).await;
    let client = client();
    let bindings = store_bindings(&client, &replicas).await;
    assert!(
        bindings.iter().all(|b| *b == bindings[0]),
        "replicas disagree on the store binding: {bindings:?}"
    );

    let started = Instant::now();
    let deadline = started + WORKLOAD_BOUND;
    let produced = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for k in 0..WORKERS_PER_REPLICA {
            workers.push(tokio::spawn(worker(
                client.clone(),
                replica.base.clone(),
                format!("w-{r}-{k}"),
                k % 2 == 1,
                produced.clone(),
                deadline,
            )));
        }
    }
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let enqueued = produce(client.clone(), bases.clone()).await;
    produced.store(true, Ordering::SeqCst);
    let mut tally = Tally::default();
    for task in workers {
        tally.merge(task.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < WORKLOAD_BOUND,
        "the workload did not finish in {WORKLOAD_BOUND:?}"
    );
    assert_eq!(enqueued, RECEIPTS);

    // Every replica sees the same finished queue.
    let expected_settled = (0..RECEIPTS).filter(|i| expected_end(kind(*i)).1).count() as u64;
    for base in &bases {
        let (status, view) = get(&client, &format!("{base}/v1/status?limit=1")).await;
        assert_eq!(status, 200, "{view}");
        let counts = &view["counts"];
        assert_eq!(
            counts,
            &json!({"pending": 0, "scheduled": 0, "held": 0, "leased": 0, "retry_scheduled": 0, "skipped": 0,
                "settled": expected_settled,
                "dead_lettered": RECEIPTS as u64 - expected_settled, "canceled": 0}),
            "status on {base}"
        );
    }

    // Every receipt, read back through the API, matches what the workers saw.
    let tally = Arc::new(tally);
    let mut readers = Vec::new();
    for part in 0..6 {
        let (client, tally, base) = (client.clone(), tally.clone(), bases[part % 3].clone());
        readers.push(tokio::spawn(async move {
            let mut problems = Vec::new();
            let mut settled = 0u64;
            for i in (part..RECEIPTS).step_by(6) {
                let id = receipt_id(i);
                match check_receipt(&client, &base, &id, tally.per_receipt.get(&id)).await {
                    Ok(true) => settled += 1,
                    Ok(false) => {}
                    Err(problem) => problems.push(problem),
                }
            }
            (settled, problems)
        }));
    }
    let mut problems = tally.violations.clone();
    let mut settled = 0;
    for reader in readers {
        let (n, found) = reader.await.expect("reader");
        settled += n;
        problems.extend(found);
    }

    // The dead letters, paged through on one replica.
    let mut letters = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url =
            reqwest::Url::parse(&format!("{}/v1/dead-letters?limit=128", bases[1])).expect("url");
        if let Some(cursor) = &after {
            url.query_pairs_mut().append_pair("after", cursor);
        }
        let (status, page) = get(&client, url.as_str()).await;
        assert_eq!(status, 200, "{page}");
        letters.extend(page["dead_letters"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    for letter in &letters {
        let id = letter["receipt_id"].as_str().expect("id");
        let kind = kind(index_of(id));
        let code = if kind == Kind::Permanent {
            "invalid_receipt_signature"
        } else {
            "rpc"
        };
        if letter["code"] != code
            || letter["attempts"].as_u64() != Some(u64::from(expected_end(kind).0))
        {
            problems.push(format!("dead letter {letter} for {kind:?}"));
        }
    }
    let dead = letters.len() as u64;
    assert_eq!(
        store_bindings(&client, &replicas).await,
        bindings,
        "binding changed"
    );
    let retried: u32 = tally.per_receipt.values().map(|s| s.retried).sum();

    println!(
        "pg_replicas: {RECEIPTS} receipts, {REPLICAS} replicas, {} workers ({} with batch claims), \
         lease {LEASE_MS} ms, commits after 0..={SLOWEST_COMMIT_MS} ms",
        REPLICAS * WORKERS_PER_REPLICA,
        REPLICAS * WORKERS_PER_REPLICA / 2
    );
    println!(
        "pg_replicas: {} claim calls ({} empty), {} receipts claimed, {} commits",
        tally.claim_calls, tally.empty_claims, tally.claimed, tally.commits
    );
    println!(
        "pg_replicas: conflicts (409 lease_conflict) {}, late commits {} (refused with 409: {}; \
         identical dead-letter replays answered with the same route: {}), answered surely in time: \
         {}, neither (deadline in flight or within {CLOCK_TOLERANCE_MS} ms): {}",
        tally.conflicts,
        tally.late,
        tally.late_refused,
        tally.late_replayed,
        tally.commits - tally.late - tally.borderline,
        tally.borderline
    );
    println!(
        "pg_replicas: settled {settled}, dead-lettered {dead}, retries scheduled {retried}, \
         elapsed {:.2} s, throughput {:.0} receipts/s",
        elapsed.as_secs_f64(),
        RECEIPTS as f64 / elapsed.as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "{} problems, first ones:\n{}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(settled + dead, RECEIPTS as u64, "nothing lost");
    if advertise {
        // The workers' claims went to one replica, whichever they reached
        // (each replica's own share would be a third).
        let mut served = Vec::new();
        for base in &bases {
            served.push(forwarding::claims_served(&client, base).await);
        }
        let total: f64 = served.iter().sum();
        let most = served.iter().copied().fold(0.0, f64::max);
        assert!(most >= total * 0.6, "claims served per replica: {served:?}");
    }
    assert_eq!(settled, expected_settled);
    assert_eq!(
        tally.late,
        tally.late_refused + tally.late_replayed,
        "every late commit was refused (or was an identical dead-letter replay)"
    );
    assert!(
        tally.late > 0 && tally.conflicts > 0,
        "the workload raced no lease (late {}, conflicts {})",
        tally.late,
        tally.conflicts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_on_one_replica_wakes_a_long_poll_on_another() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--database-url", url.as_str(), "--pg-max-connections", "4"];
    let replicas = start_replicas(dir.path(), 2, &args).await;
    let (a, b) = (replicas[0].base.clone(), replicas[1].base.clone());
    let client = client();
    let mut latencies = Vec::new();
    for round in 0..3 {
        let poll = {
            let (client, a) = (client.clone(), a.clone());
            tokio::spawn(async move {
                let request = json!({"worker_id": "waiter", "lease_ms": 5_000, "limit": 1, "wait_ms": 10_000});
                let answer = post(&client, &format!("{a}/v1/claims"), &request).await;
                (answer, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let id = format!("wake-{round}");
        let enqueued = Instant::now();
        let (status, body) = post(
            &client,
            &format!("{b}/v1/receipts"),
            &json!({"receipt_id": id, "finalized_at": 1_764_460_800}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let ((status, body), returned) = tokio::time::timeout(Duration::from_secs(12), poll)
            .await
            .expect("the long poll returned within its wait")
            .expect("poll task");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["claims"][0]["receipt_id"], id.as_str(), "{body}");
        let latency = returned.saturating_duration_since(enqueued);
        assert!(
            latency < Duration::from_secs(3),
            "woken {latency:?} after the enqueue on the other replica"
        );
        latencies.push(latency.as_millis());
    }
    println!(
        "pg_replicas: a long poll on replica A (wait_ms 10000) returned {latencies:?} ms after an \
         enqueue was sent to replica B (the 250 ms fallback poll alone would average ~125 ms)"
    );
}

/// The history feed (GET /v1/history) read page by page through replica B,
/// and followed live as a stream on replica A, shows every entry committed
/// through either replica exactly once, both in the same order, while
/// writers on both replicas race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_feed_of_one_replica_shows_every_commit_of_both_once() {
    let _turn = crate::turn(module_path!());
    const WRITERS: usize = 6;
    const EACH: usize = 40;
    let total = WRITERS * EACH;
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--database-url", url.as_str(), "--pg-max-connections", "6"];
    let replicas = start_replicas(dir.path(), 2, &args).await;
    let (a, b) = (replicas[0].base.clone(), replicas[1].base.clone());
    let client = client();

    // The stream outlives the 30 s bound of `client()`.
    let mut stream = reqwest::Client::new()
        .get(format!("{a}/v1/history"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status().as_u16(), 200);
    let streamed = tokio::spawn(async move {
        let mut text = String::new();
        let mut cursors = Vec::new();
        while cursors.len() < total {
            let chunk = tokio::time::timeout(Duration::from_secs(60), stream.chunk())
                .await
                .expect("stream events keep coming")
                .expect("stream")
                .expect("the stream stays open");
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                    cursors.push(id.to_owned());
                }
            }
        }
        cursors
    });

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (client, base) = (
                client.clone(),
                if w % 2 == 0 { a.clone() } else { b.clone() },
            );
            tokio::spawn(async move {
                for i in 0..EACH {
                    let id = format!("feed-{w}-{i}");
                    let receipt = json!({"receipt_id": id, "finalized_at": 1_764_460_800});
                    let (status, body) =
                        post(&client, &format!("{base}/v1/receipts"), &receipt).await;
                    assert_eq!(status, 201, "{body}");
                    let lease = json!({"worker_id": format!("w{w}"), "lease_ms": 30_000});
                    let (status, claim) =
                        post(&client, &format!("{base}/v1/receipts/{id}/claim"), &lease).await;
                    assert_eq!(status, 200, "{claim}");
                    let outcome = json!({"claim": claim,
                        "outcome": {"kind": "accepted", "transcript_id": format!("t-{id}")}});
                    let (status, body) = post(
                        &client,
                        &format!("{base}/v1/receipts/{id}/outcome"),
                        &outcome,
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                }
            })
        })
        .collect();

    // Pages through B, small ones, while the writers run.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut after = "0-0".to_owned();
    let mut paged: Vec<(String, String)> = Vec::new();
    while paged.len() < total {
        assert!(
            Instant::now() < deadline,
            "{} of {total} entries",
            paged.len()
        );
        let (status, page) = get(&client, &format!("{b}/v1/history?after={after}&limit=7")).await;
        assert_eq!(status, 200, "{page}");
        let entries = page["entries"].as_array().expect("entries");
        for entry in entries {
            paged.push((
                entry["cursor"].as_str().unwrap().to_owned(),
                entry["receipt_id"].as_str().unwrap().to_owned(),
            ));
        }
        after = page["next_cursor"].as_str().unwrap().to_owned();
        if entries.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let (status, page) = get(&client, &format!("{b}/v1/history?after={after}")).await;
    assert_eq!(
        (status, page["entries"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    let mut ids: Vec<&str> = paged.iter().map(|(_, id)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "every receipt's entry once");
    let cursors: Vec<String> = paged.into_iter().map(|(c, _)| c).collect();
    let streamed = tokio::time::timeout(Duration::from_secs(60), streamed)
        .await
        .expect("the stream got every entry")
        .expect("stream task");
    assert_eq!(
        streamed, cursors,
        "the stream on A and the pages on B agree"
    );
}
