use serde_json::{Value, json};
use settled::clock::Clock;
use settled::domain::RetryPolicy;

use crate::common::Fresh;
use crate::common::http::{T0, spawn, spawn_with};

fn rpc() -> Value {
    json!({"kind": "retryable", "code": "rpc", "detail": "timeout talking to rail"})
}

async fn a_receipt_retries_with_backoff_then_dead_letters_with_six_attempts(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let mut waits = Vec::new();
    for attempt in 1..=5u64 {
        let claim = s.claim("w", 1).await.remove(0);
        assert_eq!(claim["attempts"], attempt - 1);
        let route = s.outcome(&claim, rpc()).await.ok(200).clone();
        assert_eq!(route["kind"], "retry_scheduled");
        assert_eq!(route["attempt"], attempt);
        let next = route["next_visible_at_ms"].as_u64().unwrap();
        waits.push(next - s.clock.now_ms());
        assert_eq!(s.receipt("r").await["state"], "retry_scheduled");
        assert!(
            s.claim("w", 1).await.is_empty(),
            "not due before its backoff"
        );
        s.clock.set(next);
    }
    assert_eq!(waits, [250, 500, 1000, 2000, 4000]);
    let claim = s.claim("w", 1).await.remove(0);
    let route = s.outcome(&claim, rpc()).await;
    assert_eq!(
        route.ok(200),
        &json!({"kind": "dead_lettered", "attempts": 6})
    );
    let view = s.receipt("r").await;
    assert_eq!(view["state"], "dead_lettered");
    assert_eq!(view["attempts"], 6);
    assert_eq!(view["history"].as_array().unwrap().len(), 6);
    assert_eq!(view["history"][5]["route"], "dead_lettered");
    assert_eq!(view["history"][0]["attempt"], 1);
    // No rail's wait reported: the entry leaves the field out.
    assert!(view["history"][0].get("retry_after_ms").is_none(), "{view}");
    s.stop().await;
}

async fn every_outcome_kind_routes_as_documented(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["acc", "skip", "perm", "sig"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 4).await;
    let by_id = |id: &str| {
        claims
            .iter()
            .find(|c| c["receipt_id"] == id)
            .unwrap()
            .clone()
    };
    let cases = [
        (
            "acc",
            json!({"kind": "accepted", "transcript_id": "tx-9"}),
            json!({"kind": "no_action"}),
            "settled",
        ),
        (
            "skip",
            json!({"kind": "skipped", "reason": "no_economic_intent"}),
            json!({"kind": "no_action"}),
            "skipped",
        ),
        (
            "perm",
            json!({"kind": "permanent", "code": "invalid_receipt_signature", "detail": "bad"}),
            json!({"kind": "dead_lettered", "attempts": 1}),
            "dead_lettered",
        ),
        (
            "sig",
            json!({"kind": "retryable", "code": "signature", "detail": "x"}),
            json!({"kind": "dead_lettered", "attempts": 1}),
            "dead_lettered",
        ),
    ];
    for (id, outcome, route, state) in cases {
        assert_eq!(s.outcome(&by_id(id), outcome).await.ok(200), &route, "{id}");
        assert_eq!(s.receipt(id).await["state"], state, "{id}");
    }
    let acc = s.receipt("acc").await;
    assert_eq!(acc["transcript_id"], "tx-9");
    assert_eq!(s.receipt("skip").await["skip_reason"], "no_economic_intent");
    let perm = s.receipt("perm").await;
    assert_eq!(perm["dead_letter"]["code"], "invalid_receipt_signature");
    // sha256("bad"), never the text.
    let sha = "2f05d4b689d270cafb02285f35f44866f7dc8a2d368a3f9d1124373eeab31fb1";
    assert_eq!(perm["history"][0]["detail_sha256"], sha);
    assert_eq!(perm["dead_letter"]["detail_sha256"], sha);
    assert!(!perm.to_string().contains("\"bad\""));
    s.stop().await;
}

async fn max_retries_zero_dead_letters_the_first_failure(fresh: Fresh) {
    let s = spawn_with(fresh, RetryPolicy::new(0, 250, 2, 60_000).unwrap()).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    assert_eq!(
        s.outcome(&claim, rpc()).await.ok(200),
        &json!({"kind": "dead_lettered", "attempts": 1})
    );
    s.stop().await;
}

async fn stale_forged_and_late_commits_are_refused_and_change_nothing(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let before = s.receipt("r").await;
    let accepted = json!({"kind": "accepted", "transcript_id": "tx"});
    let tampered = [
        ("lease_token", json!("0".repeat(32))),
        ("lease_owner", json!("other")),
        ("row_version", json!(2)),
        ("attempts", json!(1)),
        ("finalized_at", json!(101)),
        ("lease_until_ms", json!(T0 + 30_001)),
    ];
    for (field, value) in tampered {
        let mut forged = claim.clone();
        forged[field] = value;
        s.outcome(&forged, accepted.clone()).await.assert_problem(
            409,
            "lease_conflict",
            "conflict",
        );
    }
    assert_eq!(s.receipt("r").await, before);
    // A commit observed exactly at the deadline is late.
    s.clock.set(T0 + 30_000);
    s.outcome(&claim, accepted.clone())
        .await
        .assert_problem(409, "lease_expired", "conflict");
    // After a reclaim, the old claim stays refused and the new one wins.
    let fresh_claim = s.claim("w2", 1).await.remove(0);
    s.outcome(&claim, accepted.clone())
        .await
        .assert_problem(409, "lease_conflict", "conflict");
    s.outcome(&fresh_claim, accepted.clone()).await.ok(200);
    s.outcome(&fresh_claim, accepted)
        .await
        .assert_problem(409, "receipt_finished", "conflict");
    let view = s.receipt("r").await;
    assert_eq!(view["history"].as_array().unwrap().len(), 1);
    assert_eq!(view["history"][0]["worker_id"], "w2");
    s.stop().await;
}

async fn an_identical_dead_letter_replay_gets_the_same_answer(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let perm = json!({"kind": "permanent", "code": "verification", "detail": "d"});
    let first = s.outcome(&claim, perm.clone()).await.ok(200).clone();
    s.clock.advance(60_000);
    assert_eq!(s.outcome(&claim, perm).await.ok(200), &first);
    let other = json!({"kind": "permanent", "code": "verification", "detail": "other"});
    s.outcome(&claim, other)
        .await
        .assert_problem(409, "receipt_finished", "conflict");
    assert_eq!(s.receipt("r").await["history"].as_array().unwrap().len(), 1);
    s.stop().await;
}

async fn outcome_bodies_are_validated_before_the_lease(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let mut stale = claim.clone();
    stale["lease_token"] = json!("stale");
    let bad_outcomes = [
        (
            json!({"kind": "accepted", "transcript_id": ""}),
            "invalid_transcript_id",
        ),
        (
            json!({"kind": "accepted", "transcript_id": "t".repeat(513)}),
            "invalid_transcript_id",
        ),
        (
            json!({"kind": "accepted", "transcript_id": "a\u{1}"}),
            "invalid_transcript_id",
        ),
        (json!({"kind": "accepted"}), "invalid_body"),
        (
            json!({"kind": "skipped", "reason": "Denied"}),
            "invalid_body",
        ),
        (
            json!({"kind": "retryable", "code": "RPC", "detail": ""}),
            "invalid_body",
        ),
        (json!({"kind": "permanent", "code": "nope"}), "invalid_body"),
        (
            json!({"kind": "retryable", "code": "rpc", "retry_after_ms": -1}),
            "invalid_body",
        ),
        (
            json!({"kind": "retryable", "code": "rpc", "retry_after_ms": 1.5}),
            "invalid_body",
        ),
        (
            json!({"kind": "retryable", "code": "rpc", "retry_after_ms": "5"}),
            "invalid_body",
        ),
        (
            json!({"kind": "retryable", "code": "rpc", "retry_after_ms": 9_223_372_036_854_775_808u64}),
            "invalid_retry_after",
        ),
        (
            json!({"kind": "permanent", "code": "unsupported", "retry_after_ms": 5}),
            "invalid_body",
        ),
        (json!({"kind": "done"}), "invalid_body"),
        (
            json!({"kind": "accepted", "transcript_id": "t", "extra": 1}),
            "invalid_body",
        ),
    ];
    for (outcome, code) in bad_outcomes {
        s.outcome(&stale, outcome)
            .await
            .assert_problem(422, code, "validation");
    }
    let mut bad_claims = Vec::new();
    for (field, value) in [
        ("lease_owner", json!("")),
        ("row_version", json!(-1)),
        ("row_version", json!(9_223_372_036_854_775_808u64)),
        ("lease_until_ms", json!(9_223_372_036_854_775_808u64)),
        ("attempts", json!(4_294_967_296u64)),
        ("lease_token", json!("")),
        ("unknown", json!(1)),
    ] {
        let mut c = claim.clone();
        c[field] = value;
        bad_claims.push(c);
    }
    for c in bad_claims {
        let answer = s
            .post(
                "/v1/receipts/r/outcome",
                json!({"claim": c, "outcome": {"kind": "skipped", "reason": "denied"}}),
            )
            .await;
        assert_eq!(answer.status.as_u16(), 422, "{c}: {:?}", answer.body);
    }
    let wrong_path = s
        .post(
            "/v1/receipts/other/outcome",
            json!({"claim": claim, "outcome": {"kind": "skipped", "reason": "denied"}}),
        )
        .await;
    wrong_path.assert_problem(422, "receipt_id_mismatch", "validation");
    assert_eq!(s.receipt("r").await["state"], "leased");
    s.post(
        "/v1/receipts/nope/outcome",
        json!({"claim": {"receipt_id": "nope", "finalized_at": 1, "attempts": 0,
        "row_version": 1, "lease_owner": "w", "lease_token": "t", "lease_until_ms": T0 + 1},
        "outcome": {"kind": "skipped", "reason": "denied"}}),
    )
    .await
    .assert_problem(409, "receipt_unknown", "conflict");
    s.stop().await;
}

async fn a_rails_retry_after_is_honoured_and_recorded(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["r", "b"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 2).await;
    let now = s.clock.now_ms();
    let route = s
        .outcome(
            &claims[0],
            json!({"kind": "retryable", "code": "rpc", "detail": "429", "retry_after_ms": 9_000}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(
        route,
        json!({"kind": "retry_scheduled", "attempt": 1, "next_visible_at_ms": now + 9_000})
    );
    // In a batch, beyond the policy's cap (60 s by default): the cap.
    let item = json!({"claim": claims[1], "outcome":
        {"kind": "retryable", "code": "rpc", "retry_after_ms": 3_600_000}});
    let results = s
        .post("/v1/outcomes", json!({"outcomes": [item]}))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        results["results"][0]["route"]["next_visible_at_ms"],
        now + 60_000,
        "{results}"
    );
    let id = claims[0]["receipt_id"].as_str().unwrap();
    let view = s.receipt(id).await;
    assert_eq!(view["history"][0]["retry_after_ms"], 9_000, "{view}");
    assert_eq!(view["next_visible_at_ms"], now + 9_000);
    // Not due before the rail's wait, due after it.
    s.clock.set(now + 8_999);
    assert!(s.claim("w", 1).await.is_empty());
    s.clock.set(now + 9_000);
    assert_eq!(s.claim("w", 1).await[0]["receipt_id"], id);
    s.stop().await;
}

async fn batch_outcomes_judge_each_item_in_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 3).await;
    let mut stale = claims[1].clone();
    stale["lease_token"] = json!("nope");
    let body = json!({"outcomes": [
        {"claim": claims[0], "outcome": {"kind": "accepted", "transcript_id": "t-a"}},
        {"claim": stale, "outcome": {"kind": "accepted", "transcript_id": "t-b"}},
        {"claim": claims[2], "outcome": rpc()},
        {"claim": claims[1], "outcome": {"kind": "bogus"}},
        {"claim": claims[1], "outcome": {"kind": "skipped", "reason": "denied"}},
        {"claim": claims[0], "outcome": {"kind": "accepted", "transcript_id": "t-a"}},
    ]});
    let results = s.post("/v1/outcomes", body).await.ok(200)["results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(results.len(), 6);
    assert_eq!(
        results[0],
        json!({"receipt_id": "a", "route": {"kind": "no_action"}})
    );
    assert_eq!(results[1]["error"]["code"], "lease_conflict");
    assert_eq!(results[2]["route"]["kind"], "retry_scheduled");
    assert_eq!(results[3]["error"]["class"], "validation");
    assert_eq!(results[3]["receipt_id"], "b");
    assert_eq!(results[4]["route"]["kind"], "no_action");
    assert_eq!(
        results[5]["error"]["code"], "receipt_finished",
        "a receipt is settled once"
    );
    assert_eq!(s.receipt("b").await["state"], "skipped");
    s.post("/v1/outcomes", json!({"outcomes": []}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/outcomes", json!({"outcomes": 5}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    s.stop().await;
}

crate::on_every_backend!(
    a_rails_retry_after_is_honoured_and_recorded,
    a_receipt_retries_with_backoff_then_dead_letters_with_six_attempts,
    every_outcome_kind_routes_as_documented,
    max_retries_zero_dead_letters_the_first_failure,
    stale_forged_and_late_commits_are_refused_and_change_nothing,
    an_identical_dead_letter_replay_gets_the_same_answer,
    outcome_bodies_are_validated_before_the_lease,
    batch_outcomes_judge_each_item_in_order,
);
