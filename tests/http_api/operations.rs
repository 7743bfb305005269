use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{T0, spawn};

async fn status_counts_every_state_and_samples_in_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, at) in [
        ("p2", 2),
        ("p1", 1),
        ("lease", 3),
        ("retry", 4),
        ("set", 5),
        ("skip", 6),
        ("dead", 7),
    ] {
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": at}),
        )
        .await
        .ok(201);
    }
    // Due in an hour: pending, and counted as scheduled until then.
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "later", "finalized_at": 8, "visible_at_ms": T0 + 3_600_000}),
    )
    .await
    .ok(201);
    let claim = |id: &'static str| {
        let s = &s;
        async move {
            s.post(
                &format!("/v1/receipts/{id}/claim"),
                json!({"worker_id": "w", "lease_ms": 10_000}),
            )
            .await
            .ok(200)
            .clone()
        }
    };
    let c = claim("retry").await;
    s.outcome(
        &c,
        json!({"kind": "retryable", "code": "backend", "detail": ""}),
    )
    .await
    .ok(200);
    let c = claim("set").await;
    s.outcome(&c, json!({"kind": "accepted", "transcript_id": "t"}))
        .await
        .ok(200);
    let c = claim("skip").await;
    s.outcome(&c, json!({"kind": "skipped", "reason": "denied"}))
        .await
        .ok(200);
    let c = claim("dead").await;
    s.outcome(
        &c,
        json!({"kind": "permanent", "code": "unsupported", "detail": ""}),
    )
    .await
    .ok(200);
    claim("lease").await;
    s.clock.advance(1_000);
    let status = s.get("/v1/status?limit=1").await.ok(200).clone();
    assert_eq!(
        status["counts"],
        json!({"pending": 3, "scheduled": 1, "held": 0, "leased": 1, "retry_scheduled": 1, "settled": 1, "skipped": 1, "dead_lettered": 1, "canceled": 0})
    );
    // p1 and p2 were due at T0; now is T0 + 1000.
    assert_eq!(status["oldest_due_age_ms"], 1_000);
    let pending = &status["samples"]["pending"];
    assert_eq!(pending["total"], 3);
    assert_eq!(pending["returned"], 1);
    assert_eq!(pending["truncated"], true);
    assert_eq!(pending["receipts"][0]["receipt_id"], "p1");
    assert_eq!(
        status["samples"]["dead_lettered"]["receipts"][0]["receipt_id"],
        "dead"
    );
    assert_eq!(status["samples"]["settled"]["truncated"], false);
    // The lease expires: the receipt reports pending again.
    s.clock.set(T0 + 10_000);
    let counts = s.get("/v1/status").await.body["counts"].clone();
    assert_eq!(
        (counts["pending"].clone(), counts["scheduled"].clone()),
        (json!(4), json!(1))
    );
    // The hour passes: `later` is due, no longer scheduled, still pending.
    s.clock.set(T0 + 3_600_000);
    let counts = s.get("/v1/status").await.body["counts"].clone();
    assert_eq!(
        (counts["pending"].clone(), counts["scheduled"].clone()),
        (json!(4), json!(0))
    );
    for bad in ["limit=0", "limit=4097", "limit=-1"] {
        let answer = s.get(&format!("/v1/status?{bad}")).await;
        answer.assert_problem(422, answer.body["code"].as_str().unwrap(), "validation");
    }
    s.get("/v1/status?limit=4096").await.ok(200);
    s.stop().await;
}

async fn info_reports_backend_binding_policy_and_limits(fresh: Fresh) {
    let backend = if fresh.url.starts_with("sqlite:") {
        "sqlite"
    } else {
        "postgres"
    };
    let binding = fresh.store.settlement_store_binding().to_hex();
    let s = spawn(fresh).await;
    let info = s.get("/v1/info").await.ok(200).clone();
    assert_eq!(info["backend"], backend);
    assert_eq!(info["store_binding"], binding);
    let hex = info["store_binding"].as_str().unwrap();
    assert!(
        hex.len() == 64
            && hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(
        info["retry_policy"],
        json!({"max_retries": 5, "initial_backoff_ms": 250, "backoff_multiplier": 2, "backoff_cap_ms": 60000})
    );
    assert_eq!(info["limits"]["max_claim_batch"], 1024);
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    s.stop().await;
}

async fn health_readiness_docs_and_spec_are_served(fresh: Fresh) {
    let s = spawn(fresh).await;
    assert_eq!(s.get("/healthz").await.ok(200), &json!({"status": "ok"}));
    assert_eq!(s.get("/readyz").await.ok(200), &json!({"status": "ready"}));
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let yaml = s.get("/openapi.yaml").await;
    assert_eq!(yaml.body, serde_json::Value::String(committed.clone()));
    let json_doc = s.get("/openapi.json").await.ok(200).clone();
    assert_eq!(
        json_doc,
        serde_json::to_value(settled::http::openapi()).unwrap()
    );
    let docs = s
        .client
        .get(format!("{}/docs/", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(docs.status().as_u16(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"));
    s.stop().await;
}

crate::on_every_backend!(
    status_counts_every_state_and_samples_in_order,
    info_reports_backend_binding_policy_and_limits,
    health_readiness_docs_and_spec_are_served,
);
