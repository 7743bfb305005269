//! Replicas that advertise their URLs (`--advertise-url`): a worker's claims
//! and outcomes, whichever replica they reach, are served by the one doing
//! the upkeep; when that one goes, the others serve them themselves at once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{client, enqueue_batch, get, post, replica_args, start_replicas_as};
use crate::common;
use crate::common::process::Launch;

/// Claim requests a replica served (`settled_claim_requests_total`, every
/// result summed).
pub(super) async fn claims_served(client: &reqwest::Client, base: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with("settled_claim_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Enqueue `ids` at `base` in one batch; each must be created.
async fn enqueue(client: &reqwest::Client, base: &str, ids: impl Iterator<Item = String>) {
    let receipts: Vec<Value> = ids
        .map(|id| json!({"receipt_id": id, "finalized_at": 1_764_460_800}))
        .collect();
    enqueue_batch(client, base, receipts).await;
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

async fn claim(client: &reqwest::Client, base: &str) -> (u16, Value) {
    let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1});
    post(client, &format!("{base}/v1/claims"), &body).await
}

/// Two replicas advertising their URLs, 100 receipts enqueued, and which of
/// them serves the claims sent to either.
async fn two_forwarding(dir: &std::path::Path, url: &str) -> (Vec<common::process::Server>, usize) {
    let args = replica_args(url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = start_replicas_as(dir, 2, &args, true).await;
    let client = client();
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    enqueue(&client, &bases[0], (0..100).map(|i| format!("f-{i}"))).await;
    // Within a few of the replicas' looks (once a second), a claim sent to
    // either is served by the same one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holder = loop {
        let before = [
            claims_served(&client, &bases[0]).await,
            claims_served(&client, &bases[1]).await,
        ];
        for base in &bases {
            let (status, body) = claim(&client, base).await;
            assert_eq!(status, 200, "{body}");
        }
        let served = [
            claims_served(&client, &bases[0]).await - before[0],
            claims_served(&client, &bases[1]).await - before[1],
        ];
        if let Some(holder) = served.iter().position(|&n| n == 2.0) {
            break holder;
        }
        assert!(
            Instant::now() < deadline,
            "claims never reached one replica: {served:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    (replicas, holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_the_replica_doing_the_upkeep_and_stay_served_when_it_goes() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut replicas, holder) = two_forwarding(dir.path(), &url).await;
    let client = client();
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let other = 1 - holder;
    // The holder goes: the other serves the next claim itself, at once.
    replicas.remove(holder).kill();
    let started = Instant::now();
    let (status, body) = claim(&client, &bases[other]).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["claims"].as_array().is_some_and(|c| c.len() == 1),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let (status, _) = get(&client, &format!("{}/readyz", bases[other])).await;
    assert_eq!(status, 200);
}

/// A replica doing the upkeep that stops answering without going (SIGSTOP:
/// a stalled host, a long GC-like pause) keeps its lock, since its database
/// session lives on; the others stop sending it their writes within seconds
/// and serve them themselves, rather than wait out every request. A request
/// already sent on to it is answered 503 (safe to send again) once it is
/// passed over, not after the request's whole time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_doing_the_upkeep_is_passed_over_within_seconds() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (replicas, holder) = two_forwarding(dir.path(), &url).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let other = &replicas[1 - holder].base;
    replicas[holder].signal("STOP");
    let stopped = Instant::now();
    // Sent on at once (the holder beat a moment ago), to a process that
    // will not answer.
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(25))
        .build()
        .expect("client");
    let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1});
    let waiting = patient
        .post(format!("{other}/v1/claims"))
        .json(&body)
        .send()
        .await
        .expect("a request waiting on the stalled holder is answered");
    let answered = stopped.elapsed();
    assert_eq!(waiting.status(), 503, "{:?}", waiting.text().await);
    assert_eq!(
        waiting.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let problem: Value = waiting.json().await.expect("problem+json");
    assert_eq!(problem["code"], "backend_unavailable", "{problem}");
    assert!(
        answered < Duration::from_secs(15),
        "a request sent on to the stalled holder waited {answered:?}"
    );
    let served = loop {
        let answer = client
            .post(format!("{other}/v1/claims"))
            .json(&body)
            .send()
            .await;
        if let Ok(answer) = answer
            && answer.status() == 200
        {
            break answer.json::<Value>().await.expect("claims");
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(20),
            "the other replica kept sending its claims to the stalled one"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let waited = stopped.elapsed();
    replicas[holder].signal("CONT");
    assert!(
        served["claims"].as_array().is_some_and(|c| c.len() == 1),
        "{served}"
    );
    println!(
        "forwarding: a request waiting on a stalled holder answered 503 after {answered:?}; \
         the holder was passed over after {waited:?}"
    );
}

/// An `--advertise-url` that leads to a replica of another database (a
/// shared service name, an address reused) must never hand that database's
/// receipts to this one's workers: the replica there refuses what a replica
/// of another database sent on (421), and the sender serves it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_on_to_a_replica_of_another_database_is_served_at_home() {
    let _turn = crate::turn(module_path!());
    let (Some(home), Some(away)) = (
        common::fresh_postgres_url().await,
        common::fresh_postgres_url().await,
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let client = client();
    // Their logs are kept (not shown), for the sender's warning below.
    let start = |args: Vec<String>| {
        let launch = Launch::new(dir.path()).args(&refs(&args));
        async move { launch.spawn().ready_async().await }
    };
    let elsewhere = start(replica_args(&away)).await;
    enqueue(&client, &elsewhere.base, ["away-1".to_owned()].into_iter()).await;
    // At home, the first replica (which takes the upkeep lock as it starts)
    // advertises the other database's replica; the second sends it its claims.
    let mut first_args = replica_args(&home);
    first_args.extend(["--advertise-url".to_owned(), elsewhere.base.clone()]);
    let first = start(first_args).await;
    let second = start(replica_args(&home)).await;
    enqueue(&client, &first.base, (0..50).map(|i| format!("home-{i}"))).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !second.log_text().contains("serves another database") {
        let (status, body) = claim(&client, &second.base).await;
        assert_eq!(status, 200, "{body}");
        for claimed in body["claims"].as_array().expect("claims") {
            let id = claimed["receipt_id"].as_str().unwrap_or_default();
            assert!(
                id.starts_with("home-"),
                "another database's receipt handed out: {body}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the second replica never sent a claim on to the advertised URL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = claim(&client, &second.base).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["claims"][0]["receipt_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("home-")),
        "{body}"
    );
    let (_, away_receipt) = get(&client, &format!("{}/v1/receipts/away-1", elsewhere.base)).await;
    assert_eq!(away_receipt["state"], "pending", "{away_receipt}");
    drop(first);
}
