//! A claim as the API hands it out and takes it back: every field of the
//! lease, checked once when it comes back.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{parse_receipt_id, parse_worker_id};
use crate::domain::{Claim, Claimed, LeaseToken, Observation, U63};
use crate::http::error::{ApiError, ProblemCode};
use crate::http::middleware::spans;

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
pub struct ClaimBody {
    /// The receipt claimed.
    #[schema(min_length = 1, max_length = 512)]
    pub receipt_id: String,
    /// The producer's `finalized_at` (Unix seconds).
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    pub finalized_at: u64,
    /// The receipt's `attempts` when claimed: how many invocations failed
    /// before this one. This claim is invocation `attempts + 1`, the
    /// `attempt` its history entry will show.
    pub attempts: u32,
    /// Bumped by every claim of the receipt: tells this claim from earlier ones.
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    pub row_version: u64,
    /// The `worker_id` that claimed it.
    #[schema(min_length = 1, max_length = 128)]
    pub lease_owner: String,
    /// This lease's secret (unpredictable): proves that an outcome comes from
    /// this claim. Never shown by `GET /v1/receipts/{id}`.
    #[schema(min_length = 1, max_length = 256)]
    pub lease_token: String,
    /// The lease ends at this server time (ms, exclusive): report the
    /// outcome, or extend the lease, before then.
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    pub lease_until_ms: u64,
    /// The producer's observation exactly as enqueued, or null. Not compared
    /// when the claim is sent back.
    #[serde(default)]
    #[schema(value_type = Option<Observation>)]
    pub observation: Option<Value>,
    /// The receipt's group (docs/groups.md), e.g. the rail to settle it on.
    /// Not compared when the claim is sent back.
    #[serde(default = "default_group_text")]
    #[schema(min_length = 1, max_length = 128, default = "default")]
    pub group: String,
    /// The receipt's priority within its group. Not compared when the claim
    /// is sent back.
    #[serde(default)]
    #[schema(minimum = -1000, maximum = 1000, default = 0)]
    pub priority: i64,
    /// The producer's W3C `traceparent`, when it sent one: run the work in a
    /// span that is its child (the SDKs do). Not compared when the claim is
    /// sent back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The producer's W3C `tracestate`, when it sent one. Not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

fn default_group_text() -> String {
    crate::domain::DEFAULT_GROUP.to_owned()
}

impl From<Claimed> for ClaimBody {
    fn from(claimed: Claimed) -> Self {
        let Claimed {
            claim,
            observation,
            group,
            priority,
            after_expiry: _,
            queued_since_ms: _,
            trace,
        } = claimed;
        Self {
            receipt_id: claim.receipt_id.as_str().to_owned(),
            finalized_at: claim.finalized_at.get(),
            attempts: claim.attempts,
            row_version: claim.row_version.get(),
            lease_owner: claim.lease_owner.as_str().to_owned(),
            lease_token: claim.lease_token.as_str().to_owned(),
            lease_until_ms: claim.lease_until_ms.get(),
            observation,
            group: group.as_str().to_owned(),
            priority: priority.get(),
            traceparent: trace.as_ref().map(|t| t.traceparent().to_owned()),
            tracestate: trace
                .as_ref()
                .and_then(|t| t.tracestate().map(str::to_owned)),
        }
    }
}

/// The claim a worker sent back, checked once; `observation` and `group`
/// are dropped (they are not compared).
impl TryFrom<ClaimBody> for Claim {
    type Error = ApiError;
    fn try_from(body: ClaimBody) -> Result<Self, ApiError> {
        let integer = |value: u64| {
            U63::try_from(value).map_err(|_| {
                ApiError::validation(
                    ProblemCode::InvalidClaim,
                    "claim integers must be at most 9223372036854775807",
                )
            })
        };
        Ok(Self {
            receipt_id: parse_receipt_id(&body.receipt_id)?,
            lease_owner: parse_worker_id(&body.lease_owner)?,
            lease_token: LeaseToken::parse(&body.lease_token).map_err(|e| {
                ApiError::validation(ProblemCode::InvalidClaim, format!("claim.{e}"))
            })?,
            finalized_at: integer(body.finalized_at)?,
            attempts: body.attempts,
            row_version: integer(body.row_version)?,
            lease_until_ms: integer(body.lease_until_ms)?,
        })
    }
}

/// Check a claim sent back by a worker; `path_id` is the id in the URL, if
/// any. The request's span (when traced) learns which receipt and worker it
/// is about, and the producer's context the claim carries.
pub fn parse_claim(body: ClaimBody, path_id: Option<&str>) -> Result<Claim, ApiError> {
    spans::note_claim(spans::SentClaim {
        receipt_id: &body.receipt_id,
        worker_id: &body.lease_owner,
        group: &body.group,
        traceparent: body.traceparent.as_deref(),
        tracestate: body.tracestate.as_deref(),
    });
    let claim = Claim::try_from(body)?;
    if path_id.is_some_and(|id| id != claim.receipt_id.as_str()) {
        return Err(ApiError::validation(
            ProblemCode::ReceiptIdMismatch,
            "the path id and claim.receipt_id differ",
        ));
    }
    Ok(claim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{GroupName, Priority, ReceiptId, WorkerId};

    fn handed_out() -> Claimed {
        Claimed {
            claim: Claim {
                receipt_id: ReceiptId::parse("r-1").unwrap(),
                finalized_at: U63::from(41_u32),
                attempts: 2,
                row_version: U63::from(3_u32),
                lease_owner: WorkerId::parse("w-1").unwrap(),
                lease_token: LeaseToken::parse("t-1").unwrap(),
                lease_until_ms: U63::from(50_u32),
            },
            observation: Some(serde_json::json!({"amount": 1})),
            group: GroupName::parse("rail:ach").unwrap(),
            priority: Priority::parse(7).unwrap(),
            after_expiry: true,
            queued_since_ms: 40,
            trace: None,
        }
    }

    fn code_of(body: ClaimBody) -> String {
        let refused = Claim::try_from(body).unwrap_err().problem();
        serde_json::to_value(refused.code)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_claim_sent_back_as_received_parses_to_the_lease_it_was() {
        let claimed = handed_out();
        let body = ClaimBody::from(claimed.clone());
        let text = serde_json::to_string(&body).unwrap();
        let back: ClaimBody = serde_json::from_str(&text).unwrap();
        assert_eq!(Claim::try_from(back).unwrap(), claimed.claim);
    }

    #[test]
    fn each_field_of_a_claim_is_checked_with_its_own_code() {
        let good = ClaimBody::from(handed_out());
        let cases = [
            (
                ClaimBody {
                    receipt_id: "..".into(),
                    ..good.clone()
                },
                "invalid_receipt_id",
            ),
            (
                ClaimBody {
                    lease_owner: "w\n".into(),
                    ..good.clone()
                },
                "invalid_worker_id",
            ),
            (
                ClaimBody {
                    lease_owner: String::new(),
                    ..good.clone()
                },
                "worker_id_length",
            ),
            (
                ClaimBody {
                    lease_token: "t\0".into(),
                    ..good.clone()
                },
                "invalid_claim",
            ),
            (
                ClaimBody {
                    row_version: u64::MAX,
                    ..good.clone()
                },
                "invalid_claim",
            ),
        ];
        for (body, code) in cases {
            assert_eq!(code_of(body.clone()), code, "{body:?}");
        }
        // Neither `group` nor `observation` is compared, so neither is checked.
        let loose = ClaimBody {
            group: "\u{7}".into(),
            observation: None,
            ..good
        };
        assert!(Claim::try_from(loose).is_ok());
    }
}
