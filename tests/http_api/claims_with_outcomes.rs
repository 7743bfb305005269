//! `POST /v1/claims` with `outcomes`: a worker reports what it finished and
//! asks for more work in one round trip.

use serde_json::{Value, json};

use crate::common::http::{TestServer, spawn};
use crate::common::{Fresh, raw_exec_unchecked, raw_scalars};

fn item(claim: &Value, outcome: Value) -> Value {
    json!({"claim": claim, "outcome": outcome})
}

fn accepted(tx: &str) -> Value {
    json!({"kind": "accepted", "transcript_id": tx})
}

fn retryable() -> Value {
    json!({"kind": "retryable", "code": "rpc", "detail": "timeout"})
}

async fn claim_with(
    s: &TestServer,
    limit: usize,
    outcomes: &[Value],
) -> crate::common::http::Answer {
    let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": limit, "outcomes": outcomes});
    s.post("/v1/claims", body).await
}

async fn history_len(s: &TestServer, id: &str) -> usize {
    let rows: Vec<i64> = raw_scalars(
        &s.fresh,
        &format!("SELECT COUNT(*) FROM receipt_history WHERE receipt_id = '{id}'"),
    )
    .await;
    usize::try_from(rows[0]).expect("count")
}

async fn the_outcomes_are_recorded_then_the_claim_is_made(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c"] {
        s.enqueue(id).await;
    }
    let first = s.claim("w", 2).await;
    let items = [
        item(&first[0], accepted("tx-a")),
        item(&first[1], retryable()),
        json!({"outcome": accepted("tx-x")}),
    ];
    let answer = claim_with(&s, 1, &items).await;
    let body = answer.ok(200);
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), 3, "one result per item: {body}");
    assert_eq!(results[0]["receipt_id"], "a");
    assert_eq!(results[0]["route"]["kind"], "no_action");
    assert_eq!(results[1]["receipt_id"], "b");
    assert_eq!(results[1]["route"]["kind"], "retry_scheduled");
    assert_eq!(results[2]["error"]["code"], "invalid_body", "{body}");
    assert!(body.get("claim_error").is_none(), "{body}");
    let claims = body["claims"].as_array().expect("claims");
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["receipt_id"], "c", "b waits for its backoff");
    assert_eq!(s.receipt("a").await["state"], "settled");
    assert_eq!(s.receipt("b").await["state"], "retry_scheduled");
    s.stop().await;
}

async fn a_replayed_request_records_nothing_twice(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c"] {
        s.enqueue(id).await;
    }
    let first = s.claim("w", 2).await;
    let items = [
        item(&first[0], accepted("tx-a")),
        item(&first[1], retryable()),
    ];
    let once = claim_with(&s, 1, &items).await;
    assert_eq!(once.ok(200)["results"][0]["route"]["kind"], "no_action");
    assert_eq!(
        once.ok(200)["results"][1]["route"]["kind"],
        "retry_scheduled"
    );
    assert_eq!(once.ok(200)["claims"][0]["receipt_id"], "c");
    // The answer was lost: the worker sends the same request again.
    let again = claim_with(&s, 1, &items).await;
    let body = again.ok(200);
    assert_eq!(body["results"][0]["receipt_id"], "a");
    assert_eq!(body["results"][0]["error"]["status"], 409, "{body}");
    assert_eq!(
        body["results"][0]["error"]["code"], "receipt_finished",
        "{body}"
    );
    assert_eq!(body["claims"], json!([]), "b is leased by the first answer");
    assert_eq!(history_len(&s, "a").await, 1, "recorded once");
    assert_eq!(s.receipt("a").await["state"], "settled");
    s.stop().await;
}

async fn a_bad_claim_field_records_no_outcome(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("a").await;
    let first = s.claim("w", 1).await;
    let items = [item(&first[0], accepted("tx-a"))];
    for (field, value, code) in [
        ("limit", json!(0), "claim_batch"),
        ("lease_ms", json!(0), "lease_duration"),
        ("wait_ms", json!(20_001), "invalid_wait_ms"),
        ("groups", json!([]), "invalid_group"),
    ] {
        let mut body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1, "outcomes": items});
        body[field] = value;
        let answer = s.post("/v1/claims", body).await;
        answer.assert_problem(422, code, "validation");
        assert_eq!(
            s.receipt("a").await["state"],
            "leased",
            "{field}: nothing recorded"
        );
    }
    let too_many = vec![item(&first[0], accepted("tx-a")); 1025];
    let answer = claim_with(&s, 1, &too_many).await;
    answer.assert_problem(422, "batch_size", "validation");
    assert_eq!(s.receipt("a").await["state"], "leased");
    assert_eq!(history_len(&s, "a").await, 0);
    s.stop().await;
}

async fn a_claim_that_fails_after_the_outcomes_says_so_and_keeps_them(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "z"] {
        s.enqueue(id).await;
    }
    let first = s.claim("w", 1).await;
    assert_eq!(first[0]["receipt_id"], "a");
    // A corrupt row (its version cannot advance) makes the next claim fail.
    raw_exec_unchecked(
        &s.fresh,
        "UPDATE receipts SET row_version = 9223372036854775807 WHERE receipt_id = 'z'",
    )
    .await
    .expect("plant a corrupt row");
    let answer = claim_with(&s, 1, &[item(&first[0], accepted("tx-a"))]).await;
    let body = answer.ok(200);
    assert_eq!(body["results"][0]["route"]["kind"], "no_action", "{body}");
    assert_eq!(body["claims"], json!([]));
    assert_eq!(body["claim_error"]["status"], 500, "{body}");
    assert_eq!(body["claim_error"]["code"], "invalid_record", "{body}");
    assert_eq!(
        s.receipt("a").await["state"],
        "settled",
        "the outcome stands"
    );
    // Without outcomes the same failure is the request's own status.
    let plain = claim_with(&s, 1, &[]).await;
    assert_eq!(plain.ok(200)["results"], json!([]));
    let none = s
        .post(
            "/v1/claims",
            json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1}),
        )
        .await;
    none.assert_problem(500, "invalid_record", "invalid_record");
    // The three failed claims are counted, those answered as `claim_error` too.
    let metrics = crate::metrics::parse(&s.get_text("/metrics").await);
    assert_eq!(
        metrics[r#"settled_claim_requests_total{result="failed"}"#],
        3.0
    );
    s.stop().await;
}

crate::on_every_backend!(
    the_outcomes_are_recorded_then_the_claim_is_made,
    a_replayed_request_records_nothing_twice,
    a_bad_claim_field_records_no_outcome,
    a_claim_that_fails_after_the_outcomes_says_so_and_keeps_them,
);
