//! Integers at and past their limits in request fields (times, lease and
//! wait lengths, batch limits) and in query strings: every value past a
//! bound, and every value that is no integer at all, is refused and changes
//! nothing; the largest allowed values work and nothing overflows later.

use serde_json::{Value, json};

use super::{
    Case, I64_MAX, I64_MAX_PLUS_1, REF, U64_MAX, U64_MAX_PLUS_1, post_raw, refuse_all,
    refuse_non_integers, refused, snapshot, with_number, with_ref,
};
use crate::common::Fresh;
use crate::on_every_backend;

fn receipt() -> Value {
    json!({"receipt_id": "num", "finalized_at": 1, "visible_at_ms": 1})
}

fn claims() -> Value {
    json!({"worker_id": "w", "lease_ms": 1000, "limit": 1, "wait_ms": 0})
}

fn claim_one() -> Value {
    json!({"worker_id": "w", "lease_ms": 1000})
}

async fn bounded_integers_past_their_limits_are_refused(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let (receipt, claims, claim_one) = (receipt(), claims(), claim_one());
    let extend = json!({"claim": claim, "extend_ms": 1000});
    let ref_claim = format!("/v1/receipts/{REF}/claim");
    let ref_lease = format!("/v1/receipts/{REF}/lease");
    let mut cases: Vec<Case> = Vec::new();
    for v in [I64_MAX_PLUS_1, U64_MAX] {
        cases.push((
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["finalized_at"],
            v,
            422,
            "invalid_finalized_at",
        ));
        cases.push((
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["visible_at_ms"],
            v,
            422,
            "invalid_visible_at_ms",
        ));
    }
    for v in ["0", "86400001", I64_MAX, I64_MAX_PLUS_1, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["lease_ms"],
            v,
            422,
            "lease_duration",
        ));
        cases.push((
            ref_claim.clone(),
            claim_one.clone(),
            vec!["lease_ms"],
            v,
            422,
            "lease_duration",
        ));
        cases.push((
            ref_lease.clone(),
            extend.clone(),
            vec!["extend_ms"],
            v,
            422,
            "lease_duration",
        ));
    }
    for v in ["0", "1025", I64_MAX, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["limit"],
            v,
            422,
            "claim_batch",
        ));
    }
    for v in ["20001", I64_MAX, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["wait_ms"],
            v,
            422,
            "invalid_wait_ms",
        ));
    }
    refuse_all(&s, &cases).await;
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    println!(
        "hostile_input ({}): {} bounded-integer refusals in request fields",
        s.fresh.store.backend().as_str(),
        cases.len()
    );
    s.stop().await;
}

async fn values_that_are_no_integer_are_refused_in_every_request_integer_field(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let (receipt, claims, claim_one) = (receipt(), claims(), claim_one());
    let extend = json!({"claim": claim, "extend_ms": 1000});
    let ref_claim = format!("/v1/receipts/{REF}/claim");
    let ref_lease = format!("/v1/receipts/{REF}/lease");
    let fields: Vec<(String, Value, Vec<&str>)> = vec![
        ("/v1/receipts".into(), receipt.clone(), vec!["finalized_at"]),
        (
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["visible_at_ms"],
        ),
        ("/v1/claims".into(), claims.clone(), vec!["lease_ms"]),
        ("/v1/claims".into(), claims.clone(), vec!["limit"]),
        ("/v1/claims".into(), claims.clone(), vec!["wait_ms"]),
        (ref_claim.clone(), claim_one.clone(), vec!["lease_ms"]),
        (ref_lease.clone(), extend.clone(), vec!["extend_ms"]),
    ];
    let not_integers = refuse_non_integers(&s, &fields).await;
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    println!(
        "hostile_input ({}): {not_integers} non-integer refusals in request fields",
        s.fresh.store.backend().as_str(),
    );
    s.stop().await;
}

/// Batches judge each item on its own.
async fn a_batch_item_with_an_integer_past_its_limit_is_refused_alone(fresh: Fresh) {
    let (s, _) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let item = with_number(
        &json!({"receipt_id": "b-1", "finalized_at": 1}),
        &["finalized_at"],
        U64_MAX_PLUS_1,
    );
    let answer = post_raw(
        &s,
        "/v1/receipts/batch",
        format!(r#"{{"receipts":[{item}]}}"#),
    )
    .await;
    let result = &answer.ok(200)["results"][0];
    assert_eq!(result["status"], "invalid", "{result}");
    assert_eq!(result["error"]["code"], "invalid_body", "{result}");
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    s.stop().await;
}

async fn query_integers_past_their_limits_are_refused(fresh: Fresh) {
    let (s, _) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    for (path, code) in [
        ("/v1/status?limit=0", "invalid_limit"),
        ("/v1/status?limit=4097", "invalid_limit"),
        ("/v1/status?limit=18446744073709551615", "invalid_limit"),
        ("/v1/status?limit=18446744073709551616", "invalid_query"),
        ("/v1/status?limit=-1", "invalid_query"),
        ("/v1/status?limit=1.5", "invalid_query"),
        ("/v1/dead-letters?limit=0", "invalid_limit"),
        ("/v1/dead-letters?limit=1001", "invalid_limit"),
        (
            "/v1/dead-letters?limit=18446744073709551616",
            "invalid_query",
        ),
        (
            "/v1/dead-letters?after=9223372036854775808.61",
            "invalid_cursor",
        ),
        (
            "/v1/dead-letters?after=18446744073709551616.61",
            "invalid_cursor",
        ),
        ("/v1/dead-letters?after=-1.61", "invalid_cursor"),
    ] {
        refused(&s.get(path).await, 422, code, path);
    }
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    s.stop().await;
}

/// The largest values that are allowed work, and nothing overflows later.
async fn the_largest_allowed_integers_work_and_nothing_overflows_later(fresh: Fresh) {
    let (s, _) = with_ref(fresh).await;
    let answer = post_raw(
        &s,
        "/v1/receipts",
        format!(r#"{{"receipt_id":"max-final","finalized_at":{I64_MAX}}}"#),
    )
    .await;
    assert_eq!(
        answer.ok(201)["finalized_at"],
        u64::try_from(i64::MAX).unwrap()
    );
    let answer = post_raw(
        &s,
        "/v1/receipts",
        format!(r#"{{"receipt_id":"max-visible","finalized_at":1,"visible_at_ms":{I64_MAX}}}"#),
    )
    .await;
    let view = answer.ok(201);
    assert_eq!(view["state"], "pending");
    assert_eq!(view["next_visible_at_ms"], u64::try_from(i64::MAX).unwrap());
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "zero-visible", "finalized_at": 0, "visible_at_ms": 0}),
    )
    .await
    .ok(201);
    refused(
        &s.post(
            "/v1/receipts/max-visible/claim",
            json!({"worker_id": "w", "lease_ms": 1000}),
        )
        .await,
        409,
        "receipt_not_visible",
        "never due",
    );
    let claimed = s
        .post(
            "/v1/receipts/max-final/claim",
            json!({"worker_id": "w", "lease_ms": 86_400_000}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(claimed["finalized_at"], u64::try_from(i64::MAX).unwrap());
    let extended = s
        .post(
            "/v1/receipts/max-final/lease",
            json!({"claim": claimed, "extend_ms": 86_400_000}),
        )
        .await
        .ok(200)
        .clone();
    let route = s
        .outcome(
            &extended,
            json!({"kind": "permanent", "code": "unsupported", "detail": ""}),
        )
        .await;
    assert_eq!(route.ok(200)["kind"], "dead_lettered");
    let page = s.get("/v1/dead-letters?limit=1000").await.ok(200).clone();
    assert_eq!(
        page["dead_letters"][0]["finalized_at"],
        u64::try_from(i64::MAX).unwrap()
    );
    let status = s.get("/v1/status?limit=4096").await.ok(200).clone();
    assert_eq!(status["counts"]["dead_lettered"], 1);
    assert!(status["oldest_due_age_ms"].as_u64().is_some());
    s.stop().await;
}

on_every_backend!(
    bounded_integers_past_their_limits_are_refused,
    values_that_are_no_integer_are_refused_in_every_request_integer_field,
    a_batch_item_with_an_integer_past_its_limit_is_refused_alone,
    query_integers_past_their_limits_are_refused,
    the_largest_allowed_integers_work_and_nothing_overflows_later,
);
