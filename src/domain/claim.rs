//! Claim bounds and the claim a worker holds while it settles a receipt.

use thiserror::Error;

use super::{GroupName, LeaseToken, ReceiptId};

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
    /// Worker identifier holds a control character (no backend can keep
    /// every one, and they only ever come from a bug).
    #[error("worker_id must not contain control characters")]
    WorkerIdText,
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
            Self::WorkerIdText => "invalid_worker_id",
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

/// A worker identifier of 1..=128 UTF-8 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerId(String);

impl WorkerId {
    /// Check the byte bound (bytes, not characters: `é` counts twice).
    pub fn parse(value: &str) -> Result<Self, SettlementClaimValidationError> {
        if value.is_empty() || value.len() > MAX_SETTLEMENT_WORKER_ID_BYTES {
            return Err(SettlementClaimValidationError::WorkerIdLength);
        }
        if value.chars().any(char::is_control) {
            return Err(SettlementClaimValidationError::WorkerIdText);
        }
        Ok(Self(value.to_owned()))
    }

    /// One the store holds: it was parsed before it was written.
    pub(crate) const fn from_stored(value: String) -> Self {
        Self(value)
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

/// An unsigned integer every backend stores exactly: 0..=9223372036854775807
/// (SQLite and PostgreSQL keep integers as signed 64-bit). A claim's times,
/// version and `finalized_at` are of this type once parsed, so no store
/// converts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct U63(u64);

/// A number outside 0..=9223372036854775807.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("must be 0..=9223372036854775807")]
pub struct OutOfRange;

impl U63 {
    /// The largest value: `i64::MAX`.
    pub const MAX: Self = Self(i64::MAX as u64);

    /// The value.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The value as a database integer (always fits).
    #[must_use]
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// `self + ms`, or `None` past [`U63::MAX`].
    #[must_use]
    pub fn checked_add(self, ms: u64) -> Option<Self> {
        self.0.checked_add(ms).and_then(|v| Self::try_from(v).ok())
    }
}

impl TryFrom<u64> for U63 {
    type Error = OutOfRange;
    fn try_from(value: u64) -> Result<Self, OutOfRange> {
        if i64::try_from(value).is_ok() {
            Ok(Self(value))
        } else {
            Err(OutOfRange)
        }
    }
}

impl TryFrom<i64> for U63 {
    type Error = OutOfRange;
    fn try_from(value: i64) -> Result<Self, OutOfRange> {
        u64::try_from(value).map(Self).map_err(|_| OutOfRange)
    }
}

impl From<u32> for U63 {
    fn from(value: u32) -> Self {
        Self(u64::from(value))
    }
}

impl PartialEq<u64> for U63 {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

/// `U63 + ms` is a plain number (it may pass `U63::MAX`).
impl std::ops::Add<u64> for U63 {
    type Output = u64;
    fn add(self, ms: u64) -> u64 {
        self.0 + ms
    }
}

/// `U63 - ms` is a plain number.
impl std::ops::Sub<u64> for U63 {
    type Output = u64;
    fn sub(self, ms: u64) -> u64 {
        self.0 - ms
    }
}

/// Panics past `U63::MAX` or below zero, as integer arithmetic does.
impl std::ops::AddAssign<u64> for U63 {
    fn add_assign(&mut self, ms: u64) {
        *self = self.checked_add(ms).expect("U63 overflow");
    }
}

/// Panics below zero, as integer arithmetic does.
impl std::ops::SubAssign<u64> for U63 {
    fn sub_assign(&mut self, ms: u64) {
        self.0 = self.0.checked_sub(ms).expect("U63 underflow");
    }
}

impl std::fmt::Display for U63 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A claim handed out is a claim: it reads as its lease.
impl std::ops::Deref for Claimed {
    type Target = Claim;
    fn deref(&self) -> &Claim {
        &self.claim
    }
}

/// The lease a worker holds while it settles a receipt: exactly what the
/// compare-and-swap of an outcome, extension or release compares with the
/// stored row (docs/concepts.md, "Leases"). Every field is parsed, so a
/// store binds them as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The receipt claimed.
    pub receipt_id: ReceiptId,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: U63,
    /// Failed invocations before this one.
    pub attempts: u32,
    /// Bumped by every claim of the receipt.
    pub row_version: U63,
    /// The worker that claimed it.
    pub lease_owner: WorkerId,
    /// The lease's secret.
    pub lease_token: LeaseToken,
    /// The lease ends at this server time (ms, exclusive).
    pub lease_until_ms: U63,
}

/// A claim as handed to a worker: the lease, and what the worker needs to
/// settle the receipt (neither is compared when the claim comes back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The lease.
    pub claim: Claim,
    /// The producer's observation exactly as enqueued, if any.
    pub observation: Option<serde_json::Value>,
    /// The receipt's group.
    pub group: GroupName,
    /// The receipt's priority within its group.
    pub priority: super::Priority,
    /// Whether this claim took the receipt over from a lease that expired
    /// unreported (what `/metrics` counts as a lease expiry).
    pub after_expiry: bool,
    /// Since when the receipt was claimable (server ms): its due time, or
    /// the end of the expired lease this claim took over, whichever is later
    /// (`/metrics` time in queue).
    pub queued_since_ms: u64,
    /// The producer's trace context, if it sent one.
    pub trace: Option<super::TraceContext>,
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

impl utoipa::ToSchema for Observation {}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
