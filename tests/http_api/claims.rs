use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{T0, spawn};

async fn claims_come_in_visibility_then_id_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, visible) in [
        ("b", T0 - 10),
        ("a", T0 - 10),
        ("c", T0 - 20),
        ("later", T0 + 1),
    ] {
        let body = json!({"receipt_id": id, "finalized_at": 7, "visible_at_ms": visible, "observation": {"id": id}});
        s.post("/v1/receipts", body).await.ok(201);
    }
    let claims = s.claim("w", 10).await;
    let ids: Vec<_> = claims
        .iter()
        .map(|c| c["receipt_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c", "a", "b"]);
    let c = &claims[0];
    assert_eq!(c["finalized_at"], 7);
    assert_eq!(c["attempts"], 0);
    assert_eq!(c["row_version"], 1);
    assert_eq!(c["lease_owner"], "w");
    assert_eq!(c["lease_until_ms"], T0 + 30_000);
    assert_eq!(c["observation"], json!({"id": "c"}));
    let token = c["lease_token"].as_str().unwrap();
    assert!(
        token.len() >= 32,
        "token carries at least 128 bits: {token}"
    );
    assert_ne!(claims[0]["lease_token"], claims[1]["lease_token"]);
    assert!(
        s.claim("w2", 10).await.is_empty(),
        "leased and invisible receipts are not claimable"
    );
    s.clock.advance(1);
    assert_eq!(s.claim("w2", 10).await.len(), 1, "`later` became visible");
    s.stop().await;
}

async fn an_expired_lease_is_claimable_at_its_deadline(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let first = s.claim("w1", 1).await.remove(0);
    s.clock.set(T0 + 29_999);
    assert!(s.claim("w2", 1).await.is_empty());
    s.clock.set(T0 + 30_000);
    let second = s.claim("w2", 1).await.remove(0);
    assert_eq!(second["row_version"], 2);
    assert_ne!(second["lease_token"], first["lease_token"]);
    s.stop().await;
}

async fn claims_refuse_bad_bounds_before_anything_else(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let ok = json!({"worker_id": "w", "lease_ms": 1, "limit": 1});
    let with = |k: &str, v: serde_json::Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("worker_id", json!("")), "worker_id_length"),
        (
            with("worker_id", json!("w".repeat(129))),
            "worker_id_length",
        ),
        (
            with("worker_id", json!("\u{e9}".repeat(65))),
            "worker_id_length",
        ),
        (with("worker_id", json!("w\u{0}")), "invalid_worker_id"),
        (with("worker_id", json!("w\n1")), "invalid_worker_id"),
        (with("lease_ms", json!(0)), "lease_duration"),
        (with("lease_ms", json!(86_400_001)), "lease_duration"),
        (with("limit", json!(0)), "claim_batch"),
        (with("limit", json!(1025)), "claim_batch"),
        (with("wait_ms", json!(20_001)), "invalid_wait_ms"),
        (with("lease_ms", json!(-1)), "invalid_body"),
        (with("limit", json!("1")), "invalid_body"),
        (
            with("wait_ms", json!(18_446_744_073_709_551_616.0)),
            "invalid_body",
        ),
        (with("extra", json!(1)), "invalid_body"),
        (
            json!({"worker_id": "", "lease_ms": 0, "limit": 0}),
            "worker_id_length",
        ),
        (
            json!({"worker_id": "w", "lease_ms": 0, "limit": 0}),
            "lease_duration",
        ),
    ];
    for (body, code) in cases {
        s.post("/v1/claims", body)
            .await
            .assert_problem(422, code, "validation");
    }
    assert_eq!(
        s.receipt("r").await["state"],
        "pending",
        "no refused claim leased anything"
    );
    let edges = json!({"worker_id": "\u{e9}".repeat(64), "lease_ms": 86_400_000, "limit": 1024, "wait_ms": 0});
    assert_eq!(
        s.post("/v1/claims", edges).await.ok(200)["claims"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    s.stop().await;
}

async fn a_waiting_claim_wakes_when_work_arrives(fresh: Fresh) {
    let s = spawn(fresh).await;
    let url = format!("{}/v1/claims", s.base);
    let client = s.client.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let body = json!({"worker_id": "w", "lease_ms": 1000, "limit": 5, "wait_ms": 15_000});
        let response = client.post(url).json(&body).send().await.unwrap();
        (
            response.status().as_u16(),
            response.json::<serde_json::Value>().await.unwrap(),
            started.elapsed(),
        )
    });
    // Let the claim start waiting, then enqueue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.enqueue("arrives").await;
    let (status, body, took) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["claims"][0]["receipt_id"], "arrives");
    assert!(
        took < Duration::from_secs(5),
        "woken by the enqueue, not by the 15 s timeout: {took:?}"
    );
    s.stop().await;
}

async fn a_waiting_claim_returns_empty_after_its_wait(fresh: Fresh) {
    let s = spawn(fresh).await;
    let started = Instant::now();
    let body = json!({"worker_id": "w", "lease_ms": 1000, "limit": 5, "wait_ms": 300});
    let answer = s.post("/v1/claims", body).await;
    assert_eq!(answer.ok(200)["claims"], json!([]));
    assert!(started.elapsed() >= Duration::from_millis(300));
    s.stop().await;
}

async fn claim_by_id_answers_200_404_409(fresh: Fresh) {
    let s = spawn(fresh).await;
    let body = json!({"worker_id": "w", "lease_ms": 5000});
    s.post("/v1/receipts/nope/claim", body.clone())
        .await
        .assert_problem(404, "no_active_work", "not_found");
    s.enqueue("r").await;
    let claim = s
        .post("/v1/receipts/r/claim", body.clone())
        .await
        .ok(200)
        .clone();
    assert_eq!(claim["receipt_id"], "r");
    assert_eq!(claim["row_version"], 1);
    s.post("/v1/receipts/r/claim", body.clone())
        .await
        .assert_problem(409, "receipt_leased", "conflict");
    s.outcome(&claim, json!({"kind": "skipped", "reason": "zero_charge"}))
        .await
        .ok(200);
    s.post("/v1/receipts/r/claim", body.clone())
        .await
        .assert_problem(404, "no_active_work", "not_found");
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "future", "finalized_at": 1, "visible_at_ms": T0 + 60_000}),
    )
    .await
    .ok(201);
    s.post("/v1/receipts/future/claim", body.clone())
        .await
        .assert_problem(409, "receipt_not_visible", "conflict");
    let bad = json!({"worker_id": "w", "lease_ms": 0});
    s.post("/v1/receipts/future/claim", bad)
        .await
        .assert_problem(422, "lease_duration", "validation");
    let bad = json!({"worker_id": "", "lease_ms": 5});
    s.post("/v1/receipts/nope/claim", bad).await.assert_problem(
        422,
        "worker_id_length",
        "validation",
    );
    s.stop().await;
}

crate::on_every_backend!(
    claims_come_in_visibility_then_id_order,
    an_expired_lease_is_claimable_at_its_deadline,
    claims_refuse_bad_bounds_before_anything_else,
    a_waiting_claim_wakes_when_work_arrives,
    a_waiting_claim_returns_empty_after_its_wait,
    claim_by_id_answers_200_404_409,
);
