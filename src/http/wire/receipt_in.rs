//! A receipt as a producer sends it, with its trace context.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{MAX_OBSERVATION_BYTES, fits_i64, parse_group, parse_priority, parse_receipt_id};
use crate::domain::{GroupName, Observation, TraceContext, UnixMs};
use crate::http::error::{ApiError, ProblemCode};
use crate::store::NewReceipt;

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
    #[serde(default, deserialize_with = "crate::http::strict_json::unique_keys")]
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
    /// Its priority within its group (docs/groups.md, "Priorities"):
    /// -1000..=1000, higher first; default 0. Of the due receipts of a group,
    /// a claim takes the highest priority first, then the oldest due; groups
    /// are shared out as without priorities. Part of the receipt's identity.
    #[serde(default)]
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: Option<i64>,
    /// The producer's W3C `traceparent` (`00-<trace id>-<span id>-<flags>`):
    /// kept with the receipt and handed to every claim of it, so the worker
    /// continues the producer's trace. Default: the request's `traceparent`
    /// header. Not part of the receipt's identity: the first one stored is kept.
    #[serde(default)]
    #[schema(
        min_length = 55,
        max_length = 256,
        example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    )]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with `traceparent` (at most 512 bytes).
    #[serde(default)]
    #[schema(max_length = 512)]
    pub tracestate: Option<String>,
}

/// A trace context from a body: one that is not W3C Trace Context is refused.
fn parse_trace(traceparent: &str, tracestate: Option<&str>) -> Result<TraceContext, ApiError> {
    TraceContext::parse(traceparent, tracestate)
        .map_err(|e| ApiError::validation(ProblemCode::InvalidTraceContext, e.to_string()))
}

/// The trace context of a request's `traceparent` and `tracestate` headers.
/// As the W3C recommendation asks, an invalid `traceparent` is ignored (a
/// proxy may have mangled it) and an invalid `tracestate` is dropped.
#[must_use]
pub fn header_trace(headers: &axum::http::HeaderMap) -> Option<TraceContext> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::from_headers(text("traceparent"), text("tracestate"))
}

impl ReceiptIn {
    /// Check every field; `request_trace` (the request's header) is the
    /// trace context of a receipt that names none.
    pub fn parse(self, request_trace: Option<&TraceContext>) -> Result<NewReceipt, ApiError> {
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
        let visible_at_ms = self
            .visible_at_ms
            .map(UnixMs::try_from)
            .transpose()
            .map_err(|_| {
                ApiError::validation(
                    ProblemCode::InvalidVisibleAtMs,
                    "visible_at_ms must be at most 9223372036854775807",
                )
            })?;
        let group = match self.group.as_deref() {
            None => GroupName::default_group(),
            Some(name) => parse_group(name)?,
        };
        let priority = self
            .priority
            .map(parse_priority)
            .transpose()?
            .unwrap_or_default();
        let trace = match (self.traceparent.as_deref(), self.tracestate.as_deref()) {
            (Some(parent), state) => Some(parse_trace(parent, state)?),
            (None, Some(_)) => {
                return Err(ApiError::validation(
                    ProblemCode::InvalidTraceContext,
                    "tracestate needs a traceparent",
                ));
            }
            (None, None) => request_trace.cloned(),
        };
        Ok(NewReceipt {
            receipt_id,
            finalized_at: self.finalized_at,
            observation,
            visible_at_ms,
            group,
            priority,
            trace,
        })
    }
}
