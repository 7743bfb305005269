use reqwest::Method;
use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{spawn, urlencode};

async fn enqueue_answers_201_then_200_then_409(fresh: Fresh) {
    let s = spawn(fresh).await;
    let body = json!({"receipt_id": "r-1", "finalized_at": 1764460800, "observation": {"amount": 5, "to": "x"}});
    let created = s.post("/v1/receipts", body.clone()).await;
    let view = created.ok(201);
    assert_eq!(view["state"], "pending");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["row_version"], 0);
    assert_eq!(view["observation"], json!({"amount": 5, "to": "x"}));
    assert_eq!(view["history"], json!([]));
    // Same identity, keys in another order, different visible_at_ms: identical.
    let again = json!({"receipt_id": "r-1", "finalized_at": 1764460800,
        "observation": {"to": "x", "amount": 5}, "visible_at_ms": 5});
    s.post("/v1/receipts", again).await.ok(200);
    let other = json!({"receipt_id": "r-1", "finalized_at": 1764460801, "observation": {"amount": 5, "to": "x"}});
    s.post("/v1/receipts", other)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    let other = json!({"receipt_id": "r-1", "finalized_at": 1764460800});
    s.post("/v1/receipts", other)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    assert_eq!(
        s.receipt("r-1").await["observation"],
        json!({"amount": 5, "to": "x"})
    );
    s.stop().await;
}

async fn absent_and_null_observation_are_the_same_receipt(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1}),
    )
    .await
    .ok(201);
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1, "observation": null}),
    )
    .await
    .ok(200);
    s.stop().await;
}

async fn enqueue_does_not_resurrect_finished_work(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("done").await;
    let claim = s.claim("w", 1).await.remove(0);
    s.outcome(&claim, json!({"kind": "accepted", "transcript_id": "tx"}))
        .await
        .ok(200);
    let again = s
        .post(
            "/v1/receipts",
            json!({"receipt_id": "done", "finalized_at": 100}),
        )
        .await;
    assert_eq!(again.ok(200)["state"], "settled");
    assert!(s.claim("w", 1).await.is_empty());
    s.stop().await;
}

async fn enqueue_refuses_every_bad_field(fresh: Fresh) {
    let s = spawn(fresh).await;
    let big = "x".repeat(64 * 1024);
    let cases = [
        (
            json!({"receipt_id": "", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "r".repeat(513), "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "\u{e9}".repeat(257), "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "a\u{0}b", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "a\nb", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "..", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": ".", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": -1}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": "1"}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1.5}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 9_223_372_036_854_775_808u64}),
            "invalid_finalized_at",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 18_446_744_073_709_551_615u64}),
            "invalid_finalized_at",
        ),
        (json!({"receipt_id": "r"}), "invalid_body"),
        (json!({"finalized_at": 1}), "invalid_body"),
        (json!({"receipt_id": 7, "finalized_at": 1}), "invalid_body"),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": [1]}),
            "invalid_observation",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": "text"}),
            "invalid_observation",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": {"blob": big}}),
            "observation_too_large",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "visible_at_ms": -5}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "visible_at_ms": 9_223_372_036_854_775_808u64}),
            "invalid_visible_at_ms",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "extra": true}),
            "invalid_body",
        ),
        (json!([]), "invalid_body"),
    ];
    for (body, code) in cases {
        s.post("/v1/receipts", body.clone())
            .await
            .assert_problem(422, code, "validation");
    }
    // Nothing was stored by any of them.
    let status = s.get("/v1/status").await;
    assert_eq!(status.ok(200)["counts"]["pending"], 0);
    s.stop().await;
}

async fn receipt_ids_with_slashes_dots_and_unicode_round_trip(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in [
        "a/b",
        "%2F",
        "a/../b",
        "...",
        "é/ü 漢字",
        &"r".repeat(512),
        &"\u{e9}".repeat(256),
    ] {
        s.post("/v1/receipts", json!({"receipt_id": id, "finalized_at": 1}))
            .await
            .ok(201);
        assert_eq!(s.receipt(id).await["receipt_id"], id);
    }
    s.stop().await;
}

async fn get_receipt_answers_404_and_never_shows_the_token(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.get("/v1/receipts/nope")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let token = claim["lease_token"].as_str().unwrap().to_owned();
    let view = s.receipt("r").await;
    assert_eq!(view["state"], "leased");
    assert_eq!(
        view["lease"],
        json!({"owner": "w", "until_ms": claim["lease_until_ms"]})
    );
    assert!(!view.to_string().contains(&token));
    let long = urlencode(&"r".repeat(513));
    s.get(&format!("/v1/receipts/{long}")).await.assert_problem(
        422,
        "invalid_receipt_id",
        "validation",
    );
    s.stop().await;
}

async fn batch_enqueue_judges_each_item(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("known").await;
    let body = json!({"receipts": [
        {"receipt_id": "new", "finalized_at": 100},
        {"receipt_id": "known", "finalized_at": 100},
        {"receipt_id": "known", "finalized_at": 999},
        {"receipt_id": "", "finalized_at": 1},
        {"receipt_id": "typed", "finalized_at": "x"},
        "not an object",
        {"receipt_id": "new", "finalized_at": 100},
    ]});
    let answer = s.post("/v1/receipts/batch", body).await;
    let results = answer.ok(200)["results"].as_array().unwrap().clone();
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "created", "existing", "conflict", "invalid", "invalid", "invalid", "existing"
        ]
    );
    assert_eq!(results[2]["error"]["code"], "receipt_conflict");
    assert_eq!(results[3]["error"]["code"], "invalid_receipt_id");
    assert_eq!(results[4]["receipt_id"], "typed");
    assert_eq!(results[4]["error"]["class"], "validation");
    assert!(results[5]["receipt_id"].is_null());
    assert!(results[0].get("error").is_none());
    assert_eq!(s.receipt("new").await["state"], "pending");
    s.get("/v1/receipts/typed")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.stop().await;
}

async fn batch_enqueue_refuses_malformed_batches(fresh: Fresh) {
    let s = spawn(fresh).await;
    let many: Vec<_> = (0..1025)
        .map(|i| json!({"receipt_id": format!("r{i}"), "finalized_at": 1}))
        .collect();
    s.post("/v1/receipts/batch", json!({"receipts": []}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/receipts/batch", json!({"receipts": many}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/receipts/batch", json!({"receipts": {}}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    s.post("/v1/receipts/batch", json!({}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    let full: Vec<_> = (0..1024)
        .map(|i| json!({"receipt_id": format!("r{i}"), "finalized_at": 1}))
        .collect();
    let answer = s
        .post("/v1/receipts/batch", json!({"receipts": full}))
        .await;
    assert_eq!(answer.ok(200)["results"].as_array().unwrap().len(), 1024);
    assert_eq!(s.get("/v1/status").await.body["counts"]["pending"], 1024);
    s.stop().await;
}

async fn enqueue_refuses_wrong_media_and_broken_json(fresh: Fresh) {
    let s = spawn(fresh).await;
    let body = br#"{"receipt_id":"r","finalized_at":1}"#.to_vec();
    s.raw(Method::POST, "/v1/receipts", None, body.clone())
        .await
        .assert_problem(415, "unsupported_media_type", "validation");
    s.raw(Method::POST, "/v1/receipts", Some("text/plain"), body)
        .await
        .assert_problem(415, "unsupported_media_type", "validation");
    s.raw(
        Method::POST,
        "/v1/receipts",
        Some("application/json"),
        b"{\"receipt_id\":".to_vec(),
    )
    .await
    .assert_problem(400, "malformed_json", "validation");
    s.get("/v1/receipts/r")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.stop().await;
}

crate::on_every_backend!(
    enqueue_answers_201_then_200_then_409,
    absent_and_null_observation_are_the_same_receipt,
    enqueue_does_not_resurrect_finished_work,
    enqueue_refuses_every_bad_field,
    receipt_ids_with_slashes_dots_and_unicode_round_trip,
    get_receipt_answers_404_and_never_shows_the_token,
    batch_enqueue_judges_each_item,
    batch_enqueue_refuses_malformed_batches,
    enqueue_refuses_wrong_media_and_broken_json,
);
