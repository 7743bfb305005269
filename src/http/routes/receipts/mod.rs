//! Producers hand over receipts; anyone may look one up (many at once:
//! `search`).

pub mod search;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::middleware::spans;
use crate::http::wire::{self, ReceiptIn, ReceiptView};
use crate::store::{Enqueued, StatsCounts};

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(enqueue))
        .routes(routes!(enqueue_batch))
        .routes(routes!(get_receipt))
}

/// Enqueue one finalized receipt.
///
/// Idempotent: the same receipt again (same `finalized_at` and observation)
/// answers 200 and changes nothing, whatever state it is in.
#[utoipa::path(post, path = "/v1/receipts", security(("bearer" = ["producer", "operator"])), operation_id = "v1.receipts.create", tag = "receipts",
    request_body = ReceiptIn,
    responses(
        (status = 201, description = "Stored", body = ReceiptView),
        (status = 200, description = "An identical receipt was already known", body = ReceiptView),
        (status = 409, description = "Same id, different content", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid", body = Problem, content_type = "application/problem+json"),
    ))]
async fn enqueue(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ReceiptIn>,
) -> Result<(StatusCode, Json<ReceiptView>), ApiError> {
    let receipt = body.parse(wire::header_trace(&headers).as_ref())?;
    spans::note_enqueued(receipt.receipt_id.as_str(), receipt.group.as_str());
    let now = app.now();
    let status = match app.store.enqueue_one(&receipt, now).await? {
        Enqueued::Created => {
            app.tally(&StatsCounts {
                enqueued: 1,
                ..Default::default()
            });
            StatusCode::CREATED
        }
        Enqueued::Existing => StatusCode::OK,
        Enqueued::Conflict => {
            return Err(ApiError::conflict(
                ProblemCode::ReceiptConflict,
                "a receipt with this id exists with different content",
            ));
        }
    };
    let view = app.store.receipt(&receipt.receipt_id, now).await?;
    let view = view.ok_or_else(|| ApiError::unavailable("enqueued receipt not readable"))?;
    Ok((status, Json(view.into())))
}

/// A batch of receipts to enqueue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptBatchIn {
    /// 1..=1024 receipts, each judged on its own.
    #[schema(value_type = Vec<ReceiptIn>)]
    pub receipts: Vec<Box<RawValue>>,
}

/// What happened to one receipt of a batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptBatchResult {
    /// The item's `receipt_id`, when it had one.
    pub receipt_id: Option<String>,
    pub status: BatchItemStatus,
    /// Why the item was refused (`conflict` and `invalid` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// What became of one receipt of a batch: `created` (stored now), `existing`
/// (an identical receipt was already known; nothing changed), `conflict`
/// (the id is taken by different content) or `invalid` (refused, see `error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchItemStatus {
    Created,
    Existing,
    Conflict,
    Invalid,
}

/// Results in the order of the request.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptBatchOut {
    pub results: Vec<ReceiptBatchResult>,
}

/// Enqueue up to 1024 receipts in one durable commit, each judged on its own.
#[utoipa::path(post, path = "/v1/receipts/batch", security(("bearer" = ["producer", "operator"])), operation_id = "v1.receipts.batch", tag = "receipts",
    request_body = ReceiptBatchIn,
    responses(
        (status = 200, description = "One result per item, in order", body = ReceiptBatchOut),
        (status = 422, description = "Malformed batch", body = Problem, content_type = "application/problem+json"),
    ))]
async fn enqueue_batch(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ReceiptBatchIn>,
) -> Result<Json<ReceiptBatchOut>, ApiError> {
    wire::check_batch_len(body.receipts.len())?;
    let trace = wire::header_trace(&headers);
    let mut results = Vec::with_capacity(body.receipts.len());
    let mut valid = Vec::new();
    for item in body.receipts {
        match wire::parse_item::<ReceiptIn>(&item).and_then(|r| r.parse(trace.as_ref())) {
            Ok(receipt) => {
                spans::note_enqueued(receipt.receipt_id.as_str(), receipt.group.as_str());
                let receipt_id = Some(receipt.receipt_id.as_str().to_owned());
                valid.push((results.len(), receipt));
                // Set from the store's answer below.
                results.push(ReceiptBatchResult {
                    receipt_id,
                    status: BatchItemStatus::Invalid,
                    error: None,
                });
            }
            Err(e) => results.push(ReceiptBatchResult {
                receipt_id: wire::item_receipt_id(&item, &["receipt_id"]),
                status: BatchItemStatus::Invalid,
                error: Some(e.problem()),
            }),
        }
    }
    let (indexes, receipts): (Vec<usize>, Vec<_>) = valid.into_iter().unzip();
    let outcomes = if receipts.is_empty() {
        Vec::new()
    } else {
        app.store.enqueue(&receipts, app.now()).await?
    };
    let created = outcomes.iter().filter(|o| **o == Enqueued::Created).count();
    if created > 0 {
        app.tally(&StatsCounts {
            enqueued: created as u64,
            ..Default::default()
        });
    }
    for (index, outcome) in indexes.into_iter().zip(outcomes) {
        let result = &mut results[index];
        match outcome {
            Enqueued::Created => result.status = BatchItemStatus::Created,
            Enqueued::Existing => result.status = BatchItemStatus::Existing,
            Enqueued::Conflict => {
                result.status = BatchItemStatus::Conflict;
                let e = ApiError::conflict(
                    ProblemCode::ReceiptConflict,
                    "a receipt with this id exists with different content",
                );
                result.error = Some(e.problem());
            }
        }
    }
    Ok(Json(ReceiptBatchOut { results }))
}

/// A receipt's state and history (never its lease token).
#[utoipa::path(get, path = "/v1/receipts/{id}", security(("bearer" = ["producer", "worker", "reader", "operator"])), operation_id = "v1.receipts.get", tag = "receipts",
    params(("id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    responses(
        (status = 200, description = "The receipt", body = ReceiptView),
        (status = 404, description = "Unknown receipt", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_receipt(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ReceiptView>, ApiError> {
    let id = wire::parse_receipt_id(&id)?;
    let view = app.store.receipt(&id, app.now()).await?;
    view.map(|view| Json(view.into()))
        .ok_or_else(|| ApiError::not_found(ProblemCode::ReceiptNotFound, "no receipt with this id"))
}
