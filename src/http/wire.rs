//! Request bodies as they arrive, and their parsing into domain values.
//! Everything a handler passes to the store has been checked here.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::error::{ApiError, Problem, ProblemCode};
use crate::domain::{
    GroupName, Observation, ReceiptId, SettlementAttemptClaim, SettlementFailureCode,
    SettlementFailureReason, SettlementRoute, SettlementRoutingInput, SettlementSkipReason,
    TranscriptId, WorkerId,
};
use crate::store::NewReceipt;

/// Largest serialized observation, in bytes.
pub const MAX_OBSERVATION_BYTES: usize = 64 * 1024;
/// Largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Most items in one batch request.
pub const MAX_BATCH_ITEMS: usize = 1024;
/// Longest long-poll wait, in ms.
pub const MAX_WAIT_MS: u64 = 20_000;

/// A receipt handed over by a producer.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptIn {
    /// 1..=512 UTF-8 bytes, no control characters, not `.` or `..`.
    #[schema(min_length = 1, max_length = 512)]
    pub receipt_id: String,
    /// Unix seconds of the receipt (0..=9223372036854775807).
    pub finalized_at: u64,
    /// What a worker needs to settle it: a JSON object (at most 64 KiB), or
    /// null. Kept exactly: numbers keep the text they were sent as. Duplicate
    /// keys at any depth are refused.
    #[serde(default, deserialize_with = "super::strict_json::unique_keys")]
    #[schema(value_type = Option<Observation>)]
    pub observation: Option<Value>,
    /// When it becomes due (server ms); default now. A past value is due at once.
    #[serde(default)]
    pub visible_at_ms: Option<u64>,
    /// Its group (docs/groups.md), e.g. `rail:ach` or `merchant:m_123`:
    /// 1..=128 UTF-8 bytes, no control characters, not `.` or `..`. Claims
    /// are shared out fairly over groups, and an operator may limit or
    /// pause a group. Part of the receipt's identity. Default `default`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    pub group: Option<String>,
}

fn fits_i64(value: u64) -> bool {
    i64::try_from(value).is_ok()
}

impl ReceiptIn {
    /// Check every field.
    pub fn parse(self) -> Result<NewReceipt, ApiError> {
        let receipt_id = parse_receipt_id(&self.receipt_id)?;
        if !fits_i64(self.finalized_at) {
            return Err(ApiError::validation(
                ProblemCode::InvalidFinalizedAt,
                "finalized_at must be at most 9223372036854775807",
            ));
        }
        let observation = match self.observation {
            None | Some(Value::Null) => None,
            Some(obj @ Value::Object(_)) => {
                if obj.to_string().len() > MAX_OBSERVATION_BYTES {
                    return Err(ApiError::validation(
                        ProblemCode::ObservationTooLarge,
                        "observation must be at most 64 KiB of JSON",
                    ));
                }
                Some(obj)
            }
            Some(_) => {
                return Err(ApiError::validation(
                    ProblemCode::InvalidObservation,
                    "observation must be a JSON object or null",
                ));
            }
        };
        if self.visible_at_ms.is_some_and(|v| !fits_i64(v)) {
            return Err(ApiError::validation(
                ProblemCode::InvalidVisibleAtMs,
                "visible_at_ms must be at most 9223372036854775807",
            ));
        }
        let group = match self.group.as_deref() {
            None => GroupName::default_group(),
            Some(name) => parse_group(name)?,
        };
        Ok(NewReceipt {
            receipt_id,
            finalized_at: self.finalized_at,
            observation,
            visible_at_ms: self.visible_at_ms,
            group,
        })
    }
}

/// A receipt id from a path or body. `.` and `..` are refused too: URL
/// clients normalize them away, so such a receipt could never be looked up.
pub fn parse_receipt_id(value: &str) -> Result<ReceiptId, ApiError> {
    if value == "." || value == ".." {
        return Err(ApiError::validation(
            ProblemCode::InvalidReceiptId,
            "receipt_id must not be `.` or `..` (they cannot be addressed in a URL path)",
        ));
    }
    ReceiptId::parse(value)
        .map_err(|e| ApiError::bad_id(ProblemCode::InvalidReceiptId, "receipt_id", e))
}

/// A group name from a path, a query or a body.
pub fn parse_group(value: &str) -> Result<GroupName, ApiError> {
    GroupName::parse(value)
        .map_err(|e| ApiError::validation(ProblemCode::InvalidGroup, e.to_string()))
}

/// What a worker reports after trying to settle a receipt, told apart by `kind`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutcomeIn {
    /// The rail accepted the settlement: the receipt is settled.
    #[schema(title = "AcceptedOutcome")]
    Accepted {
        /// The rail's transcript id: 1..=512 bytes, no control characters.
        transcript_id: String,
    },
    /// No settlement is needed: the receipt is skipped.
    #[schema(title = "SkippedOutcome")]
    Skipped { reason: SettlementSkipReason },
    /// It may succeed later: with code `rpc` or `backend` the receipt is
    /// retried after a backoff (until the retry policy's `max_retries`);
    /// with any other code it is dead-lettered.
    #[schema(title = "RetryableOutcome")]
    Retryable {
        code: SettlementFailureCode,
        /// Free text; only its SHA-256 is stored.
        #[serde(default)]
        detail: String,
        /// The rail's own wait before another try, in ms (its `Retry-After`):
        /// the retry waits the longer of this and the policy's backoff, at
        /// most the policy's `backoff_cap_ms`; recorded in the history entry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
        retry_after_ms: Option<u64>,
    },
    /// It will never succeed: the receipt is dead-lettered.
    #[schema(title = "PermanentOutcome")]
    Permanent {
        code: SettlementFailureCode,
        /// Free text; only its SHA-256 is stored.
        #[serde(default)]
        detail: String,
    },
}

impl OutcomeIn {
    /// Normalize; the detail text becomes its digest here and goes no further.
    pub fn parse(self) -> Result<SettlementRoutingInput, ApiError> {
        Ok(match self {
            Self::Accepted { transcript_id } => SettlementRoutingInput::Accepted {
                transcript_id: TranscriptId::parse(&transcript_id).map_err(|e| {
                    ApiError::bad_id(ProblemCode::InvalidTranscriptId, "transcript_id", e)
                })?,
            },
            Self::Skipped { reason } => SettlementRoutingInput::Skipped { reason },
            Self::Retryable {
                code,
                detail,
                retry_after_ms,
            } => {
                if retry_after_ms.is_some_and(|ms| !fits_i64(ms)) {
                    return Err(ApiError::validation(
                        ProblemCode::InvalidRetryAfter,
                        "retry_after_ms must be at most 9223372036854775807",
                    ));
                }
                SettlementRoutingInput::Retryable {
                    reason: SettlementFailureReason::new(code, &detail),
                    retry_after_ms,
                }
            }
            Self::Permanent { code, detail } => SettlementRoutingInput::Permanent {
                reason: SettlementFailureReason::new(code, &detail),
            },
        })
    }
}

/// A worker id: 1..=128 bytes, and no control characters (they
/// cannot be stored by every backend and only ever come from a bug).
pub fn parse_worker_id(value: &str) -> Result<WorkerId, ApiError> {
    let worker = WorkerId::parse(value)?;
    if value.chars().any(char::is_control) {
        return Err(ApiError::validation(
            ProblemCode::InvalidWorkerId,
            "worker_id must not contain control characters",
        ));
    }
    Ok(worker)
}

/// Check a claim sent back by a worker; `path_id` is the id in the URL, if any.
pub fn parse_claim(
    claim: SettlementAttemptClaim,
    path_id: Option<&str>,
) -> Result<SettlementAttemptClaim, ApiError> {
    parse_receipt_id(&claim.receipt_id)?;
    if path_id.is_some_and(|id| id != claim.receipt_id) {
        return Err(ApiError::validation(
            ProblemCode::ReceiptIdMismatch,
            "the path id and claim.receipt_id differ",
        ));
    }
    parse_worker_id(&claim.lease_owner)?;
    if claim.lease_token.is_empty() || claim.lease_token.len() > 256 {
        return Err(ApiError::validation(
            ProblemCode::InvalidClaim,
            "claim.lease_token must be 1..=256 bytes",
        ));
    }
    if ![claim.finalized_at, claim.row_version, claim.lease_until_ms]
        .into_iter()
        .all(fits_i64)
    {
        return Err(ApiError::validation(
            ProblemCode::InvalidClaim,
            "claim integers must be at most 9223372036854775807",
        ));
    }
    Ok(claim)
}

/// One claim and its outcome.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeRequest {
    /// The claim exactly as received.
    pub claim: SettlementAttemptClaim,
    pub outcome: OutcomeIn,
}

impl OutcomeRequest {
    /// Check both parts.
    pub fn parse(
        self,
        path_id: Option<&str>,
    ) -> Result<(SettlementAttemptClaim, SettlementRoutingInput), ApiError> {
        Ok((parse_claim(self.claim, path_id)?, self.outcome.parse()?))
    }
}

/// Check a batch's size.
pub fn check_batch_len(len: usize) -> Result<(), ApiError> {
    if len == 0 || len > MAX_BATCH_ITEMS {
        return Err(ApiError::validation(
            ProblemCode::BatchSize,
            "a batch holds 1..=1024 items",
        ));
    }
    Ok(())
}

/// Parse one batch item on its own, so one bad item does not refuse the
/// rest. Items are read from the text sent (not from a parsed value), so
/// duplicate keys are still seen and numbers keep their exact text.
pub fn parse_item<T: serde::de::DeserializeOwned>(item: &RawValue) -> Result<T, ApiError> {
    serde_json::from_str(item.get()).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            // Too deeply nested: the batch parses around it, the item does not.
            ApiError::malformed(e.to_string())
        } else {
            ApiError::validation(ProblemCode::InvalidBody, e.to_string())
        }
    })
}

/// The `receipt_id` of a batch item that could not be parsed, when it has a
/// usable one.
#[must_use]
pub fn item_receipt_id(item: &RawValue, path: &[&str]) -> Option<String> {
    let item: Value = serde_json::from_str(item.get()).ok()?;
    let mut at = &item;
    for key in path {
        at = at.get(key)?;
    }
    at.as_str().map(str::to_owned)
}

/// The result of one item of `POST /v1/outcomes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutcomeResult {
    /// The item's `claim.receipt_id`, when it had one.
    pub receipt_id: Option<String>,
    /// What the server did with the outcome, when it was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<SettlementRoute>,
    /// Why the item was refused (then nothing changed for it), e.g. 409
    /// `lease_conflict` for a claim that is no longer the lease, or
    /// `lease_expired` for one sent too late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}
