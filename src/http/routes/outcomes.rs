//! Workers report outcomes (one, or a batch judged item by item) and keep or
//! give back their leases.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::{Claim, LeaseMs, Outcome, Route, StoreError};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::wire::{self, ClaimBody, OutcomeRequest, OutcomeResult};
use crate::store::StoreResult;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(record_one))
        .routes(routes!(record_batch))
        .routes(routes!(extend_lease, release_lease))
        .routes(routes!(extend_batch))
}

/// Record the outcome of a claimed receipt.
///
/// Succeeds only while the claim is the receipt's current lease (sent back
/// exactly as received) and that lease has not ended; otherwise 409 and
/// nothing changes: `lease_conflict` (not the current lease), `lease_expired`,
/// `receipt_not_leased`, `receipt_finished` or `receipt_unknown`.
#[utoipa::path(post, path = "/v1/receipts/{id}/outcome", security(("bearer" = ["worker", "operator"])), operation_id = "v1.receipts.outcome", tag = "outcomes",
    params(("id" = String, Path, description = "Receipt id; must equal claim.receipt_id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = OutcomeRequest,
    responses(
        (status = 200, description = "What the store did", body = Route),
        (status = 409, description = "Stale, forged or expired claim, or no active work", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid, or path id differs from claim.receipt_id", body = Problem, content_type = "application/problem+json"),
    ))]
async fn record_one(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<OutcomeRequest>,
) -> Result<Json<Route>, ApiError> {
    wire::parse_receipt_id(&id)?;
    let (claim, outcome) = body.parse(Some(&id))?;
    let route = app
        .store
        .record_claimed_outcome(&claim, &outcome, app.policy, app.now())
        .await;
    Ok(Json(app.count(route, &claim, &outcome)?))
}

/// A batch of outcomes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBatchIn {
    /// 1..=1024 items, each judged on its own, in order.
    #[schema(value_type = Vec<OutcomeRequest>)]
    pub outcomes: Vec<Box<RawValue>>,
}

/// One result per item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeBatchOut {
    pub results: Vec<OutcomeResult>,
}

/// Record up to 1024 outcomes in one durable commit, each judged on its own.
#[utoipa::path(post, path = "/v1/outcomes", security(("bearer" = ["worker", "operator"])), operation_id = "v1.outcomes.batch", tag = "outcomes",
    request_body = OutcomeBatchIn,
    responses(
        (status = 200, description = "One result per item, in order", body = OutcomeBatchOut),
        (status = 422, description = "Malformed batch", body = Problem, content_type = "application/problem+json"),
    ))]
async fn record_batch(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<OutcomeBatchIn>,
) -> Result<Json<OutcomeBatchOut>, ApiError> {
    wire::check_batch_len(body.outcomes.len())?;
    let results = record_items(&app, body.outcomes).await?;
    Ok(Json(OutcomeBatchOut { results }))
}

/// Judge each item on its own and record the valid ones in one durable
/// commit: one result per item, in order. An error means none was recorded.
async fn record_items(
    app: &AppState,
    items: Vec<Box<RawValue>>,
) -> Result<Vec<OutcomeResult>, ApiError> {
    let parsed = Parsed::of(items);
    let routed = if parsed.pairs.is_empty() {
        Vec::new()
    } else {
        app.store
            .record_claimed_outcomes(&parsed.pairs, app.policy, app.now())
            .await?
    };
    Ok(parsed.answer(app, routed))
}

/// A batch of outcome items, each judged on its own before anything is
/// recorded.
pub(super) struct Parsed {
    /// One per item, in order; the malformed ones already answered.
    results: Vec<OutcomeResult>,
    /// The position in `results` of each of `pairs`.
    indexes: Vec<usize>,
    /// The well-formed items, to record.
    pub pairs: Vec<(Claim, Outcome)>,
}

impl Parsed {
    pub fn of(items: Vec<Box<RawValue>>) -> Self {
        let mut results = Vec::with_capacity(items.len());
        let mut indexes = Vec::new();
        let mut pairs = Vec::new();
        for item in items {
            match wire::parse_item::<OutcomeRequest>(&item).and_then(|r| r.parse(None)) {
                Ok(pair) => {
                    indexes.push(results.len());
                    results.push(OutcomeResult {
                        receipt_id: Some(pair.0.receipt_id.as_str().to_owned()),
                        route: None,
                        error: None,
                    });
                    pairs.push(pair);
                }
                Err(e) => results.push(OutcomeResult {
                    receipt_id: wire::item_receipt_id(&item, &["claim", "receipt_id"]),
                    route: None,
                    error: Some(e.problem()),
                }),
            }
        }
        Self {
            results,
            indexes,
            pairs,
        }
    }

    /// The results, with what the store did with each of `pairs` (counted).
    pub fn answer(mut self, app: &AppState, routed: Vec<StoreResult<Route>>) -> Vec<OutcomeResult> {
        // A store that answered fewer items than it was given leaves the
        // rest answered as an error, never as neither route nor error.
        let mut routed = routed.into_iter();
        for (index, (claim, input)) in self.indexes.into_iter().zip(&self.pairs) {
            let result = routed
                .next()
                .unwrap_or_else(|| Err(StoreError::internal("an item was left unanswered")));
            match app.count(result, claim, input) {
                Ok(route) => self.results[index].route = Some(route),
                Err(e) => self.results[index].error = Some(e.problem()),
            }
        }
        self.results
    }
}

/// Extend a lease (heartbeat).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseExtendIn {
    pub claim: ClaimBody,
    /// New lease length from now: 1..=86400000 ms.
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub extend_ms: u64,
}

/// A batch of lease extensions.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseExtendBatchIn {
    /// 1..=1024 items, each judged on its own, in order.
    #[schema(value_type = Vec<LeaseExtendIn>)]
    pub leases: Vec<Box<RawValue>>,
}

/// The result of one item of `POST /v1/leases/extend`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseExtendResult {
    /// The item's `claim.receipt_id`, when it had one.
    pub receipt_id: Option<String>,
    /// The claim with its new `lease_until_ms`, when the lease was extended:
    /// from now on it is the one to send back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimBody>,
    /// Why the item was refused (then nothing changed for it), e.g. 409
    /// `lease_conflict` or `lease_expired`: the lease is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// One result per item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseExtendBatchOut {
    pub results: Vec<LeaseExtendResult>,
}

/// Give a lease back.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseReleaseIn {
    pub claim: ClaimBody,
}

/// Extend a live lease to now + `extend_ms`; token and version stay the same.
#[utoipa::path(post, path = "/v1/receipts/{id}/lease", security(("bearer" = ["worker", "operator"])), operation_id = "v1.receipts.lease.extend", tag = "outcomes",
    params(("id" = String, Path, description = "Receipt id; must equal claim.receipt_id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = LeaseExtendIn,
    responses(
        (status = 200, description = "The claim with its new lease_until_ms", body = ClaimBody),
        (status = 409, description = "Stale, forged or expired claim", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid", body = Problem, content_type = "application/problem+json"),
    ))]
async fn extend_lease(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<LeaseExtendIn>,
) -> Result<Json<ClaimBody>, ApiError> {
    wire::parse_receipt_id(&id)?;
    let claim = wire::parse_claim(body.claim, Some(&id))?;
    let extend = LeaseMs::try_from(body.extend_ms)?;
    let claimed = app.checked(app.store.extend_lease(&claim, extend, app.now()).await)?;
    app.metrics.extended();
    Ok(Json(claimed.into()))
}

/// Extend up to 1024 leases at once (a worker's heartbeat for every lease it
/// holds), each judged on its own as `POST /v1/receipts/{id}/lease` would.
///
/// Every item answers either its new claim or its own error: one item's 409
/// says nothing about the others, and a 503 in one item's `error` means that
/// lease was not extended (its old claim is still the one to send).
#[utoipa::path(post, path = "/v1/leases/extend", security(("bearer" = ["worker", "operator"])), operation_id = "v1.leases.extend", tag = "outcomes",
    request_body = LeaseExtendBatchIn,
    responses(
        (status = 200, description = "One result per item, in order", body = LeaseExtendBatchOut),
        (status = 422, description = "Malformed batch", body = Problem, content_type = "application/problem+json"),
    ))]
async fn extend_batch(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<LeaseExtendBatchIn>,
) -> Result<Json<LeaseExtendBatchOut>, ApiError> {
    wire::check_batch_len(body.leases.len())?;
    let now = app.now();
    let parsed: Vec<Result<(crate::domain::Claim, LeaseMs), ApiError>> = body
        .leases
        .iter()
        .map(|item| {
            let request = wire::parse_item::<LeaseExtendIn>(item)?;
            Ok((
                wire::parse_claim(request.claim, None)?,
                LeaseMs::try_from(request.extend_ms)?,
            ))
        })
        .collect();
    let valid: Vec<_> = parsed
        .iter()
        .filter_map(|p| p.as_ref().ok())
        .cloned()
        .collect();
    let mut extended = app.store.extend_leases(&valid, now).await.into_iter();
    let results = body
        .leases
        .iter()
        .zip(parsed)
        .map(|(item, parsed)| match parsed {
            Err(e) => LeaseExtendResult {
                receipt_id: wire::item_receipt_id(item, &["claim", "receipt_id"]),
                claim: None,
                error: Some(e.problem()),
            },
            Ok((claim, _)) => {
                let answer = extended
                    .next()
                    .unwrap_or_else(|| Err(crate::domain::StoreError::internal("no result")));
                let (claim_out, error) = match app.checked(answer) {
                    Ok(claimed) => {
                        app.metrics.extended();
                        (Some(claimed.into()), None)
                    }
                    Err(e) => (None, Some(e.problem())),
                };
                LeaseExtendResult {
                    receipt_id: Some(claim.receipt_id.as_str().to_owned()),
                    claim: claim_out,
                    error,
                }
            }
        })
        .collect();
    Ok(Json(LeaseExtendBatchOut { results }))
}

/// Release a live lease without using up an attempt: the receipt is due again at once.
#[utoipa::path(delete, path = "/v1/receipts/{id}/lease", security(("bearer" = ["worker", "operator"])), operation_id = "v1.receipts.lease.release", tag = "outcomes",
    params(("id" = String, Path, description = "Receipt id; must equal claim.receipt_id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = LeaseReleaseIn,
    responses(
        (status = 204, description = "Released"),
        (status = 409, description = "Stale, forged or expired claim", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid", body = Problem, content_type = "application/problem+json"),
    ))]
async fn release_lease(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<LeaseReleaseIn>,
) -> Result<StatusCode, ApiError> {
    wire::parse_receipt_id(&id)?;
    let claim = wire::parse_claim(body.claim, Some(&id))?;
    app.checked(app.store.release_lease(&claim, app.now()).await)?;
    Ok(StatusCode::NO_CONTENT)
}
