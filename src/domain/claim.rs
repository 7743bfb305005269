//! Claim bounds and the claim a worker holds while it settles a receipt.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use utoipa::ToSchema;

/// Maximum UTF-8 byte length of a settlement worker identifier.
pub const MAX_SETTLEMENT_WORKER_ID_BYTES: usize = 128;

/// Maximum settlement claim lease duration in milliseconds.
pub const MAX_SETTLEMENT_LEASE_MS: u64 = 86_400_000;

/// Maximum number of rows returned by one settlement claim.
pub const MAX_SETTLEMENT_CLAIM_BATCH: usize = 1024;

/// Invalid settlement claim parameters.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum SettlementClaimValidationError {
    /// Worker identifier is empty or exceeds its UTF-8 byte bound.
    #[error("worker_id must be 1..=128 UTF-8 bytes")]
    WorkerIdLength,
    /// Lease duration is zero or exceeds the one-day bound.
    #[error("lease duration must be 1..=86400000 ms")]
    LeaseDuration,
    /// Claim batch is zero or exceeds the row-count bound.
    #[error("claim limit must be 1..=1024")]
    ClaimBatch,
}

impl SettlementClaimValidationError {
    /// Stable machine code used in HTTP problem bodies.
    #[must_use]
    pub const fn code(self) -> &'static str {
        match self {
            Self::WorkerIdLength => "worker_id_length",
            Self::LeaseDuration => "lease_duration",
            Self::ClaimBatch => "claim_batch",
        }
    }
}

/// Validate parameters shared by settlement claim operations.
pub fn validate_settlement_claim(
    worker_id: &str,
    lease_ms: u64,
    limit: usize,
) -> Result<(), SettlementClaimValidationError> {
    WorkerId::parse(worker_id)?;
    LeaseMs::try_from(lease_ms)?;
    ClaimLimit::try_from(limit)?;
    Ok(())
}

/// A worker identifier of 1..=128 UTF-8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerId(String);

impl WorkerId {
    /// Check the byte bound (bytes, not characters: `é` counts twice).
    pub fn parse(value: &str) -> Result<Self, SettlementClaimValidationError> {
        if value.is_empty() || value.len() > MAX_SETTLEMENT_WORKER_ID_BYTES {
            return Err(SettlementClaimValidationError::WorkerIdLength);
        }
        Ok(Self(value.to_owned()))
    }

    /// The identifier as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A lease (or lease extension) duration of 1..=86_400_000 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseMs(u64);

impl TryFrom<u64> for LeaseMs {
    type Error = SettlementClaimValidationError;
    fn try_from(value: u64) -> Result<Self, Self::Error> {
        if value == 0 || value > MAX_SETTLEMENT_LEASE_MS {
            return Err(SettlementClaimValidationError::LeaseDuration);
        }
        Ok(Self(value))
    }
}

impl LeaseMs {
    /// Milliseconds.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A claim batch size of 1..=1024.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimit(usize);

impl TryFrom<usize> for ClaimLimit {
    type Error = SettlementClaimValidationError;
    fn try_from(value: usize) -> Result<Self, Self::Error> {
        if value == 0 || value > MAX_SETTLEMENT_CLAIM_BATCH {
            return Err(SettlementClaimValidationError::ClaimBatch);
        }
        Ok(Self(value))
    }
}

impl ClaimLimit {
    /// Row count.
    #[must_use]
    pub const fn get(self) -> usize {
        self.0
    }
}

/// A claimed receipt: what a worker needs to settle it, and the lease under
/// which it reports the outcome.
///
/// Send it back exactly as received: an outcome, heartbeat or release is
/// accepted only while every field but `group` and `observation` matches the receipt's
/// current lease (otherwise a 409 whose code says why, e.g. `lease_conflict`
/// or `lease_expired`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Claim)]
pub struct SettlementAttemptClaim {
    /// The receipt claimed.
    pub receipt_id: String,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    /// The receipt's `attempts` when claimed: how many invocations failed
    /// before this one. This claim is invocation `attempts + 1`, the
    /// `attempt` its history entry will show.
    pub attempts: u32,
    /// Bumped by every claim of the receipt: tells this claim from earlier ones.
    pub row_version: u64,
    /// The `worker_id` that claimed it.
    pub lease_owner: String,
    /// This lease's secret (unpredictable): proves that an outcome comes from
    /// this claim. Never shown by `GET /v1/receipts/{id}`.
    pub lease_token: String,
    /// The lease ends at this server time (ms, exclusive): report the
    /// outcome, or extend the lease, before then.
    pub lease_until_ms: u64,
    /// The producer's observation exactly as enqueued, or null. Not compared
    /// when the claim is sent back.
    #[serde(default)]
    #[schema(value_type = Option<Observation>)]
    pub observation: Option<serde_json::Value>,
    /// The receipt's group (docs/groups.md), e.g. the rail to settle it on.
    /// Not compared when the claim is sent back.
    #[serde(default = "default_group_text")]
    #[schema(min_length = 1, max_length = 128, default = "default")]
    pub group: String,
}

fn default_group_text() -> String {
    super::DEFAULT_GROUP.to_owned()
}

/// The OpenAPI schema of an observation (the values themselves are
/// `serde_json::Value`s): any JSON object, so that generated clients let a
/// producer send any fields and a worker read them.
pub struct Observation;

impl utoipa::PartialSchema for Observation {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .description(Some(
                "What a worker needs to settle a receipt: any JSON object the producer \
                 chooses (at most 64 KiB). Kept exactly as sent: numbers keep their digits.",
            ))
            .examples([serde_json::json!({"amount_cents": 1250, "currency": "EUR"})])
            .into()
    }
}

impl ToSchema for Observation {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_claim_carries_the_persisted_cas_state() {
        let claim = SettlementAttemptClaim {
            receipt_id: "receipt-1".to_string(),
            finalized_at: 41,
            attempts: 2,
            row_version: 3,
            lease_owner: "worker-1".to_string(),
            lease_token: "token-1".to_string(),
            lease_until_ms: 50,
            observation: None,
            group: "rail:ach".to_string(),
        };
        let round: SettlementAttemptClaim =
            serde_json::from_value(serde_json::to_value(&claim).unwrap()).unwrap();
        assert_eq!(round, claim);
        assert_eq!(claim.finalized_at, 41);
        assert_eq!(claim.attempts, 2);
        assert_eq!(claim.lease_owner, "worker-1");
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
            SettlementClaimValidationError::LeaseDuration.code(),
            "lease_duration"
        );
        assert_eq!(
            SettlementClaimValidationError::ClaimBatch.code(),
            "claim_batch"
        );
    }
}
