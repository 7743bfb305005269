//! Lease calls over HTTP: extensions and releases, one or a batch, each
//! judged on its own, and refused once the lease has expired.

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::{T0, spawn};

async fn leases_extend_and_release(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    s.clock.advance(20_000);
    let extend = json!({"claim": claim, "extend_ms": 60_000});
    let extended = s.post("/v1/receipts/r/lease", extend).await.ok(200).clone();
    assert_eq!(extended["lease_until_ms"], T0 + 80_000);
    assert_eq!(extended["lease_token"], claim["lease_token"]);
    assert_eq!(extended["row_version"], claim["row_version"]);
    // The old deadline is no longer the lease.
    s.post(
        "/v1/receipts/r/lease",
        json!({"claim": claim, "extend_ms": 1000}),
    )
    .await
    .assert_problem(409, "lease_conflict", "conflict");
    s.post(
        "/v1/receipts/r/lease",
        json!({"claim": extended, "extend_ms": 0}),
    )
    .await
    .assert_problem(422, "lease_duration", "validation");
    s.post(
        "/v1/receipts/r/lease",
        json!({"claim": extended, "extend_ms": 86_400_001}),
    )
    .await
    .assert_problem(422, "lease_duration", "validation");
    s.post(
        "/v1/receipts/x/lease",
        json!({"claim": extended, "extend_ms": 5}),
    )
    .await
    .assert_problem(422, "receipt_id_mismatch", "validation");
    let release = s
        .call(
            Method::DELETE,
            "/v1/receipts/r/lease",
            Some(json!({"claim": extended})),
        )
        .await;
    assert_eq!(release.status.as_u16(), 204);
    let view = s.receipt("r").await;
    assert_eq!(view["state"], "pending");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["history"][0]["outcome"], "released");
    s.call(
        Method::DELETE,
        "/v1/receipts/r/lease",
        Some(json!({"claim": extended})),
    )
    .await
    .assert_problem(409, "receipt_not_leased", "conflict");
    assert_eq!(s.claim("w2", 1).await.len(), 1, "due again at once");
    s.stop().await;
}

async fn batch_lease_extension_judges_each_item_in_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c", "d/e f"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 4).await;
    let mut forged = claims[1].clone();
    forged["lease_token"] = json!("forged");
    s.clock.advance(10_000);
    let body = json!({"leases": [
        {"claim": claims[0], "extend_ms": 60_000},
        {"claim": forged, "extend_ms": 60_000},
        {"claim": claims[2], "extend_ms": 0},
        {"claim": claims[3], "extend_ms": 50_000},
        {"claim": {"receipt_id": "b"}, "extend_ms": 5_000},
    ]});
    let results = s.post("/v1/leases/extend", body).await.ok(200)["results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(results.len(), 5);
    let extended = &results[0]["claim"];
    assert_eq!(results[0]["receipt_id"], "a");
    assert_eq!(extended["lease_until_ms"], T0 + 70_000);
    assert_eq!(extended["lease_token"], claims[0]["lease_token"]);
    assert!(results[0].get("error").is_none(), "{results:?}");
    assert_eq!(results[1]["error"]["code"], "lease_conflict");
    assert_eq!(results[1]["error"]["status"], 409);
    assert!(results[1].get("claim").is_none());
    assert_eq!(results[2]["error"]["code"], "lease_duration");
    assert_eq!(results[2]["receipt_id"], "c");
    assert_eq!(results[3]["claim"]["lease_until_ms"], T0 + 60_000);
    assert_eq!(results[3]["receipt_id"], "d/e f");
    assert_eq!(results[4]["error"]["class"], "validation");
    assert_eq!(results[4]["receipt_id"], "b");
    // The refused items changed nothing; the extended claim is the lease now.
    assert_eq!(s.receipt("b").await["lease"]["until_ms"], T0 + 30_000);
    assert_eq!(s.receipt("c").await["lease"]["until_ms"], T0 + 30_000);
    s.post(
        "/v1/leases/extend",
        json!({"leases": [{"claim": claims[0], "extend_ms": 1_000}]}),
    )
    .await
    .ok(200)["results"][0]["error"]["code"]
        .as_str()
        .map(|code| assert_eq!(code, "lease_conflict"))
        .unwrap();
    let route = s
        .outcome(extended, json!({"kind": "accepted", "transcript_id": "t"}))
        .await;
    assert_eq!(route.ok(200)["kind"], "no_action");
    // Past the old deadline only the extended lease still holds.
    s.clock.set(T0 + 30_000);
    let late = json!({"leases": [
        {"claim": claims[2], "extend_ms": 1_000},
        {"claim": results[3]["claim"], "extend_ms": 1_000},
    ]});
    let late = s.post("/v1/leases/extend", late).await.ok(200)["results"].clone();
    assert_eq!(late[0]["error"]["code"], "lease_expired");
    assert_eq!(late[1]["claim"]["lease_until_ms"], T0 + 31_000);
    s.post("/v1/leases/extend", json!({"leases": []}))
        .await
        .assert_problem(422, "batch_size", "validation");
    let too_many: Vec<Value> = (0..1025)
        .map(|_| json!({"claim": claims[2], "extend_ms": 1}))
        .collect();
    s.post("/v1/leases/extend", json!({"leases": too_many}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/leases/extend", json!({"claims": []}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    s.stop().await;
}

async fn an_expired_lease_cannot_be_extended_or_released(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    assert_eq!(claim["lease_until_ms"], T0 + 30_000);
    s.clock.set(T0 + 30_000);
    s.post(
        "/v1/receipts/r/lease",
        json!({"claim": claim, "extend_ms": 1000}),
    )
    .await
    .assert_problem(409, "lease_expired", "conflict");
    s.call(
        Method::DELETE,
        "/v1/receipts/r/lease",
        Some(json!({"claim": claim})),
    )
    .await
    .assert_problem(409, "lease_expired", "conflict");
    assert_eq!(s.receipt("r").await["state"], "pending");
    s.stop().await;
}

crate::on_every_backend!(
    leases_extend_and_release,
    batch_lease_extension_judges_each_item_in_order,
    an_expired_lease_cannot_be_extended_or_released,
);
