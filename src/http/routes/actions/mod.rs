//! Operators act on one receipt: hold, unhold and cancel (docs/operators.md,
//! "Act on many receipts"; many at once: `bulk`). Every change appends to
//! the receipt's history, naming the operator's token when it has a name.

pub mod bulk;

use axum::extract::State;
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::middleware::auth::Caller;
use crate::http::wire::{self, ReceiptView};
use crate::store::actions::MAX_REASON_BYTES;
use crate::store::{ActionRefusal, OperatorAction};

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(hold))
        .routes(routes!(unhold))
        .routes(routes!(cancel))
}

/// A redrive's body: nothing is needed. Send `{}` or no body at all (it is
/// ignored), but always with `Content-Type: application/json`.
#[derive(Debug, ToSchema)]
pub struct RedriveIn {}

/// The name recorded in history for the caller, if its token has one.
pub(super) fn actor(caller: Option<&Extension<Caller>>) -> Option<&str> {
    caller.and_then(|c| c.name.as_deref())
}

/// An operator's reason: 1..=512 bytes of text without control characters.
pub(super) fn parse_reason(
    reason: Option<String>,
    required: bool,
) -> Result<Option<String>, ApiError> {
    let bad = |detail: &str| ApiError::validation(ProblemCode::InvalidReason, detail.to_owned());
    match reason {
        None if required => Err(bad("a reason is required (1..=512 bytes)")),
        None => Ok(None),
        Some(r) if r.trim().is_empty() || r.len() > MAX_REASON_BYTES => {
            Err(bad("reason must be 1..=512 bytes and not blank"))
        }
        Some(r) if r.chars().any(char::is_control) => {
            Err(bad("reason must not contain control characters"))
        }
        Some(r) => Ok(Some(r)),
    }
}

/// The problem answering a refusal for one receipt.
pub(super) fn refusal(refused: ActionRefusal) -> ApiError {
    match refused {
        ActionRefusal::NotFound => {
            ApiError::not_found(ProblemCode::ReceiptNotFound, "no receipt with this id")
        }
        ActionRefusal::NotDeadLettered => ApiError::not_found(
            ProblemCode::DeadLetterNotFound,
            "this receipt is not dead-lettered",
        ),
        ActionRefusal::NotActive => ApiError::conflict(
            ProblemCode::ReceiptNotActive,
            "this receipt has no active work (finished or dead-lettered): only pending, \
             scheduled, leased and retrying receipts can be held",
        ),
        ActionRefusal::Finished => ApiError::conflict(
            ProblemCode::ReceiptFinished,
            "this receipt is already settled, skipped or canceled",
        ),
        ActionRefusal::Leased => ApiError::conflict(
            ProblemCode::ReceiptLeased,
            "a live lease holds this receipt and its worker may be settling it: hold it, and \
             cancel once the lease has ended",
        ),
    }
}

/// Act on one receipt and answer its view: every single-receipt action of
/// the API, redrive included.
pub(super) async fn act_on_one(
    app: &AppState,
    action: OperatorAction,
    id: &str,
    caller: Option<&Extension<Caller>>,
) -> Result<Json<ReceiptView>, ApiError> {
    let id = wire::parse_receipt_id(id)?;
    let now = app.now();
    let ids = std::slice::from_ref(&id);
    let results = app
        .store
        .act(&action, ids, actor(caller), now, false)
        .await?;
    let result = results
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::unavailable("operator action gave no result"))?;
    app.metrics.acted(action.name(), &result);
    result.map_err(|refused| match (&action, refused) {
        // An unknown id is no dead letter either: a redrive has one 404.
        (OperatorAction::Redrive, ActionRefusal::NotFound) => {
            refusal(ActionRefusal::NotDeadLettered)
        }
        (_, refused) => refusal(refused),
    })?;
    let view = app.store.receipt(&id, now).await?;
    view.map(|view| Json(view.into()))
        .ok_or_else(|| ApiError::unavailable("acted-on receipt not readable"))
}

/// Why an operator holds or cancels a receipt.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasonIn {
    /// 1..=512 bytes, no control characters; recorded as the history
    /// entry's `note`. Required to cancel, optional to hold.
    pub reason: Option<String>,
}

/// Hold a receipt: no claim takes it until it is unheld.
///
/// Its state, attempts and due time are kept. A live lease on it is not
/// revoked: its worker may still report the outcome, extend or release the
/// lease (a retry then waits, held, until unheld). Holding a held receipt
/// changes nothing and answers 200.
#[utoipa::path(post, path = "/v1/receipts/{receipt_id}/hold", security(("bearer" = ["operator"])), operation_id = "v1.receipts.hold", tag = "operator actions",
    params(("receipt_id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = ReasonIn,
    responses(
        (status = 200, description = "The receipt, held", body = ReceiptView),
        (status = 404, description = "No such receipt", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not active (`receipt_not_active`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id or reason", body = Problem, content_type = "application/problem+json"),
    ))]
async fn hold(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReasonIn>,
) -> Result<Json<ReceiptView>, ApiError> {
    let reason = parse_reason(body.reason, false)?;
    act_on_one(&app, OperatorAction::Hold { reason }, &id, caller.as_ref()).await
}

/// Unhold a receipt: claimable again once due.
///
/// Needs no body (send `{}` or nothing, with `Content-Type:
/// application/json`). Unholding a receipt that is not held changes nothing
/// and answers 200.
#[utoipa::path(post, path = "/v1/receipts/{receipt_id}/unhold", security(("bearer" = ["operator"])), operation_id = "v1.receipts.unhold", tag = "operator actions",
    params(("receipt_id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body(content = Option<RedriveIn>, description = "Ignored: send `{}` or nothing"),
    responses(
        (status = 200, description = "The receipt, not held", body = ReceiptView),
        (status = 404, description = "No such receipt", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not active (`receipt_not_active`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    ))]
async fn unhold(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ReceiptView>, ApiError> {
    act_on_one(&app, OperatorAction::Unhold, &id, caller.as_ref()).await
}

/// Cancel a receipt: finished for good (`canceled`), never to be settled.
///
/// Pending, scheduled, retrying, held and dead-lettered receipts can be
/// canceled; a receipt a live lease holds cannot (409 `receipt_leased`: its
/// worker may be settling it now; hold it and cancel once the lease ends).
/// Enqueueing the same receipt again answers the canceled receipt.
#[utoipa::path(post, path = "/v1/receipts/{receipt_id}/cancel", security(("bearer" = ["operator"])), operation_id = "v1.receipts.cancel", tag = "operator actions",
    params(("receipt_id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = ReasonIn,
    responses(
        (status = 200, description = "The receipt, canceled", body = ReceiptView),
        (status = 404, description = "No such receipt", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Leased (`receipt_leased`) or already finished (`receipt_finished`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id, or no reason", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReasonIn>,
) -> Result<Json<ReceiptView>, ApiError> {
    let reason = parse_reason(body.reason, true)?.unwrap_or_default();
    act_on_one(
        &app,
        OperatorAction::Cancel { reason },
        &id,
        caller.as_ref(),
    )
    .await
}
