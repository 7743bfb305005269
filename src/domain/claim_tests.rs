//! Tests of claims and their checks (`claim`).

use super::*;

#[test]
fn attempt_claim_carries_the_persisted_cas_state() {
    let claim = Claim {
        receipt_id: ReceiptId::parse("receipt-1").unwrap(),
        finalized_at: U63::try_from(41_u64).unwrap(),
        attempts: 2,
        row_version: U63::try_from(3_u64).unwrap(),
        lease_owner: WorkerId::parse("worker-1").unwrap(),
        lease_token: LeaseToken::parse("token-1").unwrap(),
        lease_until_ms: U63::try_from(50_u64).unwrap(),
    };
    assert_eq!(claim.finalized_at, 41);
    assert_eq!(claim.attempts, 2);
    assert_eq!(claim.lease_owner.as_str(), "worker-1");
}

#[test]
fn stored_integers_are_those_a_signed_64_bit_column_holds() {
    assert_eq!(U63::try_from(i64::MAX as u64), Ok(U63::MAX));
    assert_eq!(U63::try_from(i64::MAX as u64 + 1), Err(OutOfRange));
    assert_eq!(U63::try_from(-1_i64), Err(OutOfRange));
    assert_eq!(U63::try_from(0_i64).map(U63::as_i64), Ok(0));
    assert_eq!(U63::MAX.checked_add(1), None);
    assert_eq!(U63::from(7_u32).checked_add(3), Some(U63::from(10_u32)));
}

#[test]
fn claim_parameters_are_bounded() {
    assert!(validate_settlement_claim("worker", 1, 1).is_ok());
    assert!(
        validate_settlement_claim(
            &"w".repeat(MAX_SETTLEMENT_WORKER_ID_BYTES),
            MAX_SETTLEMENT_LEASE_MS,
            MAX_SETTLEMENT_CLAIM_BATCH,
        )
        .is_ok()
    );
    assert!(validate_settlement_claim(&"\u{e9}".repeat(64), 1, 1).is_ok());

    let invalid = [
        (
            validate_settlement_claim("", 1, 1),
            SettlementClaimValidationError::WorkerIdLength,
        ),
        (
            validate_settlement_claim(&"w".repeat(MAX_SETTLEMENT_WORKER_ID_BYTES + 1), 1, 1),
            SettlementClaimValidationError::WorkerIdLength,
        ),
        (
            validate_settlement_claim(&"\u{e9}".repeat(65), 1, 1),
            SettlementClaimValidationError::WorkerIdLength,
        ),
        (
            validate_settlement_claim("work\u{0}er", 1, 1),
            SettlementClaimValidationError::WorkerIdText,
        ),
        (
            validate_settlement_claim("worker", 0, 1),
            SettlementClaimValidationError::LeaseDuration,
        ),
        (
            validate_settlement_claim("worker", MAX_SETTLEMENT_LEASE_MS + 1, 1),
            SettlementClaimValidationError::LeaseDuration,
        ),
        (
            validate_settlement_claim("worker", 1, 0),
            SettlementClaimValidationError::ClaimBatch,
        ),
        (
            validate_settlement_claim("worker", 1, MAX_SETTLEMENT_CLAIM_BATCH + 1),
            SettlementClaimValidationError::ClaimBatch,
        ),
    ];

    for (result, expected) in invalid {
        assert_eq!(result, Err(expected));
    }
}

#[test]
fn validation_checks_worker_then_lease_then_limit() {
    assert_eq!(
        validate_settlement_claim("", 0, 0),
        Err(SettlementClaimValidationError::WorkerIdLength)
    );
    assert_eq!(
        validate_settlement_claim("w", 0, 0),
        Err(SettlementClaimValidationError::LeaseDuration)
    );
}

#[test]
fn validation_codes_are_the_documented_labels() {
    assert_eq!(
        SettlementClaimValidationError::WorkerIdLength.code(),
        "worker_id_length"
    );
    assert_eq!(
        SettlementClaimValidationError::WorkerIdText.code(),
        "invalid_worker_id"
    );
    assert_eq!(
        SettlementClaimValidationError::LeaseDuration.code(),
        "lease_duration"
    );
    assert_eq!(
        SettlementClaimValidationError::ClaimBatch.code(),
        "claim_batch"
    );
}
