//! An outcome as a worker reports it, with its claim, and the result of
//! one item of a batch of them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::claim::{ClaimBody, parse_claim};
use super::{fits_i64, parse_rail_code};
use crate::domain::{
    Claim, Outcome, Route, SettlementFailureCode, SettlementFailureReason, SettlementSkipReason,
    TranscriptId,
};
use crate::http::error::{ApiError, Problem, ProblemCode};

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
        /// The rail's own code for the failure, e.g. `card_declined` (1..=64
        /// characters of `[A-Za-z0-9_.:-]`): kept in history and shown
        /// beside `code`, which alone decides retry or dead letter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
        rail_code: Option<String>,
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
        /// The rail's own code for the failure, e.g. `card_declined` (1..=64
        /// characters of `[A-Za-z0-9_.:-]`): kept in history and shown
        /// beside `code`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
        rail_code: Option<String>,
    },
}

impl OutcomeIn {
    /// Normalize; the detail text becomes its digest here and goes no further.
    pub fn parse(self) -> Result<Outcome, ApiError> {
        Ok(match self {
            Self::Accepted { transcript_id } => Outcome::Accepted {
                transcript_id: TranscriptId::parse(&transcript_id).map_err(|e| {
                    ApiError::bad_id(ProblemCode::InvalidTranscriptId, "transcript_id", e)
                })?,
            },
            Self::Skipped { reason } => Outcome::Skipped { reason },
            Self::Retryable {
                code,
                detail,
                rail_code,
                retry_after_ms,
            } => {
                if retry_after_ms.is_some_and(|ms| !fits_i64(ms)) {
                    return Err(ApiError::validation(
                        ProblemCode::InvalidRetryAfter,
                        "retry_after_ms must be at most 9223372036854775807",
                    ));
                }
                Outcome::Retryable {
                    reason: SettlementFailureReason::new(code, &detail)
                        .with_rail_code(rail_code.as_deref().map(parse_rail_code).transpose()?),
                    retry_after_ms,
                }
            }
            Self::Permanent {
                code,
                detail,
                rail_code,
            } => Outcome::Permanent {
                reason: SettlementFailureReason::new(code, &detail)
                    .with_rail_code(rail_code.as_deref().map(parse_rail_code).transpose()?),
            },
        })
    }
}

/// One claim and its outcome.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeRequest {
    /// The claim exactly as received.
    pub claim: ClaimBody,
    pub outcome: OutcomeIn,
}

impl OutcomeRequest {
    /// Check both parts.
    pub fn parse(self, path_id: Option<&str>) -> Result<(Claim, Outcome), ApiError> {
        Ok((parse_claim(self.claim, path_id)?, self.outcome.parse()?))
    }
}

/// The result of one item of `POST /v1/outcomes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutcomeResult {
    /// The item's `claim.receipt_id`, when it had one.
    pub receipt_id: Option<String>,
    /// What the server did with the outcome, when it was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    /// Why the item was refused (then nothing changed for it), e.g. 409
    /// `lease_conflict` for a claim that is no longer the lease, or
    /// `lease_expired` for one sent too late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}
