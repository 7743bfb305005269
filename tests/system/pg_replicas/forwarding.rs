//! Replicas that advertise their URLs (`--advertise-url`): a worker's claims
//! and outcomes, whichever replica they reach, are served by the one doing
//! the upkeep; when that one goes, the others serve them themselves at once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{client, get, post, replica_args, start_replicas_as};
use crate::common;

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

async fn claim(client: &reqwest::Client, base: &str) -> (u16, Value) {
    let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1});
    post(client, &format!("{base}/v1/claims"), &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_the_replica_doing_the_upkeep_and_stay_served_when_it_goes() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = replica_args(&url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replicas = start_replicas_as(dir.path(), 2, &args, true).await;
    let client = client();
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let receipts: Vec<Value> = (0..100)
        .map(|i| json!({"receipt_id": format!("f-{i}"), "finalized_at": 1_764_460_800}))
        .collect();
    let (status, body) = post(
        &client,
        &format!("{}/v1/receipts/batch", bases[0]),
        &json!({"receipts": receipts}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
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
