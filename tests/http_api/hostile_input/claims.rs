//! Forged claims: a claim sent back with a field past its type's range is
//! refused, one with a representable value that is not what is stored is a
//! conflict, and none of them is a server error or changes anything.

use serde_json::{Value, json};

use super::{
    Case, I64_MAX, I64_MAX_PLUS_1, REF, U64_MAX, post_raw, refuse_all, refuse_non_integers,
    snapshot, with_number, with_ref,
};
use crate::common;
use crate::common::Fresh;
use crate::on_every_backend;

/// A claim sent back with an outcome, and with a lease extension.
fn outcome_and_extend(claim: &Value) -> (Value, Value) {
    (
        json!({"claim": claim, "outcome": {"kind": "accepted", "transcript_id": "tx"}}),
        json!({"claim": claim, "extend_ms": 1000}),
    )
}

async fn claim_fields_past_their_range_are_refused_and_representable_ones_conflict(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let (outcome, extend) = outcome_and_extend(&claim);
    let ref_outcome = format!("/v1/receipts/{REF}/outcome");
    let ref_lease = format!("/v1/receipts/{REF}/lease");
    let mut cases: Vec<Case> = Vec::new();
    for field in ["finalized_at", "row_version", "lease_until_ms"] {
        for v in [I64_MAX_PLUS_1, U64_MAX] {
            cases.push((
                ref_outcome.clone(),
                outcome.clone(),
                vec!["claim", field],
                v,
                422,
                "invalid_claim",
            ));
            cases.push((
                ref_lease.clone(),
                extend.clone(),
                vec!["claim", field],
                v,
                422,
                "invalid_claim",
            ));
        }
        // Representable but not what is stored: a conflict.
        for v in ["0", I64_MAX] {
            cases.push((
                ref_outcome.clone(),
                outcome.clone(),
                vec!["claim", field],
                v,
                409,
                "lease_conflict",
            ));
        }
    }
    // attempts is a u32.
    for v in ["4294967296", I64_MAX, U64_MAX] {
        cases.push((
            ref_outcome.clone(),
            outcome.clone(),
            vec!["claim", "attempts"],
            v,
            422,
            "invalid_body",
        ));
    }
    for v in ["7", "4294966"] {
        cases.push((
            ref_outcome.clone(),
            outcome.clone(),
            vec!["claim", "attempts"],
            v,
            409,
            "lease_conflict",
        ));
    }
    refuse_all(&s, &cases).await;
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    println!(
        "hostile_input ({}): {} bounded-integer refusals in claim fields",
        s.fresh.store.backend().as_str(),
        cases.len()
    );
    s.stop().await;
}

async fn values_that_are_no_integer_are_refused_in_every_claim_field(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let (outcome, extend) = outcome_and_extend(&claim);
    let ref_outcome = format!("/v1/receipts/{REF}/outcome");
    let ref_lease = format!("/v1/receipts/{REF}/lease");
    let mut fields: Vec<(String, Value, Vec<&str>)> = Vec::new();
    for field in ["finalized_at", "attempts", "row_version", "lease_until_ms"] {
        fields.push((ref_outcome.clone(), outcome.clone(), vec!["claim", field]));
        fields.push((ref_lease.clone(), extend.clone(), vec!["claim", field]));
    }
    let not_integers = refuse_non_integers(&s, &fields).await;
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    println!(
        "hostile_input ({}): {not_integers} non-integer refusals in claim fields",
        s.fresh.store.backend().as_str(),
    );
    s.stop().await;
}

/// Batches judge each item on its own.
async fn a_batch_outcome_with_a_claim_field_past_its_range_is_refused_alone(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let (outcome, _) = outcome_and_extend(&claim);
    let item = with_number(&outcome, &["claim", "row_version"], I64_MAX_PLUS_1);
    let answer = post_raw(&s, "/v1/outcomes", format!(r#"{{"outcomes":[{item}]}}"#)).await;
    let result = &answer.ok(200)["results"][0];
    assert_eq!(result["error"]["code"], "invalid_claim", "{result}");
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    s.stop().await;
}

on_every_backend!(
    claim_fields_past_their_range_are_refused_and_representable_ones_conflict,
    values_that_are_no_integer_are_refused_in_every_claim_field,
    a_batch_outcome_with_a_claim_field_past_its_range_is_refused_alone,
);

/// A forged claim whose `attempts` is `u32::MAX` would overflow `attempts + 1`;
/// since it does not match the stored row it is a 409 conflict, not a 500
/// `invalid_record` (which would mislead operators about corrupt data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_claim_with_attempts_at_u32_max_is_a_conflict() {
    let (s, claim) = with_ref(common::fresh_sqlite().await).await;
    let before = snapshot(&s).await;
    for outcome in [
        json!({"kind": "accepted", "transcript_id": "tx"}),
        json!({"kind": "retryable", "code": "rpc", "detail": ""}),
    ] {
        let body = json!({"claim": claim, "outcome": outcome});
        let answer = post_raw(
            &s,
            &format!("/v1/receipts/{REF}/outcome"),
            with_number(&body, &["claim", "attempts"], "4294967295"),
        )
        .await;
        answer.assert_problem(409, "lease_conflict", "conflict");
    }
    assert_eq!(snapshot(&s).await, before);
    s.stop().await;
}
