//! Tests of outcomes, routes and their store errors (`route`).

use super::*;

#[test]
fn outcome_store_error_classes_are_bounded() {
    let cases = [
        (
            StoreError::backend("db unavailable"),
            StoreErrorClass::Backend,
        ),
        (
            StoreError::conflict(ConflictKind::LeaseMismatch, "stale lease"),
            StoreErrorClass::Conflict,
        ),
        (
            StoreError::invalid_record("negative counter"),
            StoreErrorClass::InvalidRecord,
        ),
        (
            StoreError::internal("an answer of the wrong kind"),
            StoreErrorClass::Internal,
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(error.class(), expected);
    }
}

#[test]
fn routes_serialize_as_the_documented_objects() {
    let cases = [
        (Route::NoAction, serde_json::json!({"kind": "no_action"})),
        (
            Route::RetryScheduled {
                attempt: 1,
                next_visible_at_ms: 350,
            },
            serde_json::json!({"kind": "retry_scheduled", "attempt": 1, "next_visible_at_ms": 350}),
        ),
        (
            Route::DeadLettered { attempts: 6 },
            serde_json::json!({"kind": "dead_lettered", "attempts": 6}),
        ),
    ];
    for (route, json) in cases {
        assert_eq!(serde_json::to_value(route).unwrap(), json);
        let text = json.to_string();
        assert_eq!(serde_json::from_str::<Route>(&text).unwrap(), route);
    }
    assert!(serde_json::from_str::<Route>(r#"{"kind":"retry_scheduled"}"#).is_err());
    assert!(serde_json::from_str::<Route>(r#"{"kind":"nope"}"#).is_err());
}

#[test]
fn failure_detail_is_kept_only_as_its_sha256() {
    let reason = SettlementFailureReason::new(SettlementFailureCode::Rpc, "abc");
    assert_eq!(
        reason.detail_sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn binding_hex_is_64_lower_case_characters() {
    let b = SettlementStoreBinding::from_digest([0xAB; 32]);
    assert_eq!(b.to_hex(), "ab".repeat(32));
    assert_eq!(b.as_bytes(), &[0xAB; 32]);
}
