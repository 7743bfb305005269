//! Operators inspect dead letters and put them back to work.

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::middleware::auth::Caller;
use crate::http::routes::actions::{RedriveIn, act_on_one};
use crate::http::wire::{self, DeadLetter, ReceiptView};
use crate::store::{DeadLetterCursor, OperatorAction};

/// Default and largest page size.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get_one))
        .routes(routes!(redrive))
}

/// Page parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// 1..=1000, default 100.
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page (as `GET /v1/receipts` takes it).
    pub cursor: Option<String>,
    /// The same as `cursor`, under its older name.
    pub after: Option<String>,
}

/// A page of dead letters ordered by `(finalized_at, receipt_id)`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLettersOut {
    pub dead_letters: Vec<DeadLetter>,
    /// Pass as `cursor` for the next page; null on the last page (the same
    /// shape as `GET /v1/receipts`).
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    /// The same as `next_cursor` under its older name, absent on the last
    /// page; kept for clients written before `next_cursor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(deprecated)]
    pub next: Option<String>,
}

fn encode_cursor(letter: &crate::store::DeadLetter) -> String {
    format!(
        "{}.{}",
        letter.finalized_at,
        hex::encode(&letter.receipt_id)
    )
}

fn decode_cursor(text: &str) -> Result<DeadLetterCursor, ApiError> {
    let bad = || {
        ApiError::validation(
            ProblemCode::InvalidCursor,
            "cursor must be a `next_cursor` value from a previous page",
        )
    };
    let (at, id) = text.split_once('.').ok_or_else(bad)?;
    let at: u64 = at.parse().map_err(|_| bad())?;
    let id = String::from_utf8(hex::decode(id).map_err(|_| bad())?).map_err(|_| bad())?;
    if i64::try_from(at).is_err() {
        return Err(bad());
    }
    Ok((at, id))
}

/// List dead letters, oldest receipt first.
#[utoipa::path(get, path = "/v1/dead-letters", security(("bearer" = ["reader", "operator"])), operation_id = "v1.dead_letters.list", tag = "dead letters",
    params(PageQuery),
    responses(
        (status = 200, description = "A page", body = DeadLettersOut),
        (status = 422, description = "Bad limit or cursor", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<DeadLettersOut>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::validation(
            ProblemCode::InvalidLimit,
            "limit must be 1..=1000",
        ));
    }
    let after = match (query.cursor.as_deref(), query.after.as_deref()) {
        (Some(cursor), Some(after)) if cursor != after => {
            return Err(ApiError::validation(
                ProblemCode::InvalidCursor,
                "give the cursor once: `cursor` (or its older name `after`)",
            ));
        }
        (cursor, after) => cursor.or(after).map(decode_cursor).transpose()?,
    };
    // One extra row tells whether another page exists.
    let mut dead_letters = app.store.dead_letters(limit + 1, after).await?;
    let more = dead_letters.len() > limit;
    dead_letters.truncate(limit);
    let next = if more {
        dead_letters.last().map(encode_cursor)
    } else {
        None
    };
    Ok(Json(DeadLettersOut {
        dead_letters: dead_letters.into_iter().map(Into::into).collect(),
        next_cursor: next.clone(),
        next,
    }))
}

/// One dead letter.
#[utoipa::path(get, path = "/v1/dead-letters/{id}", security(("bearer" = ["reader", "operator"])), operation_id = "v1.dead_letters.get", tag = "dead letters",
    params(("id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    responses(
        (status = 200, description = "The dead letter", body = DeadLetter),
        (status = 404, description = "Not dead-lettered", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_one(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeadLetter>, ApiError> {
    let id = wire::parse_receipt_id(&id)?;
    let letter = app.store.dead_letter(&id).await?;
    letter.map(|letter| Json(letter.into())).ok_or_else(|| {
        ApiError::not_found(
            ProblemCode::DeadLetterNotFound,
            "this receipt is not dead-lettered",
        )
    })
}

/// Put a dead letter back to work: pending, attempts 0, history kept.
///
/// Needs no body, but must be sent with `Content-Type: application/json`
/// like every state-changing request (a body, if any, is ignored): an HTML
/// form on another site cannot send that, so it cannot redrive through an
/// operator's browser. Generated clients that send the header only with a
/// body (openapi-fetch) send `{}`.
#[utoipa::path(post, path = "/v1/dead-letters/{id}/redrive", security(("bearer" = ["operator"])), operation_id = "v1.dead_letters.redrive", tag = "dead letters",
    params(("id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body(content = Option<RedriveIn>, description = "Ignored: send `{}` or nothing"),
    responses(
        (status = 200, description = "The receipt, pending again", body = ReceiptView),
        (status = 404, description = "Not dead-lettered", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    ))]
async fn redrive(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ReceiptView>, ApiError> {
    act_on_one(&app, OperatorAction::Redrive, &id, caller.as_ref()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_any_receipt_id() {
        let letter = crate::store::DeadLetter {
            receipt_id: "a.b/é%2F".into(),
            finalized_at: 7,
            attempts: 1,
            code: crate::domain::SettlementFailureCode::Rpc,
            detail_sha256: String::new(),
            last_failure: crate::store::FailureView {
                code: crate::domain::SettlementFailureCode::Rpc,
                detail_sha256: String::new(),
                rail_code: None,
            },
            dead_lettered_at_ms: 0,
            group: "default".into(),
        };
        let (at, id) = decode_cursor(&encode_cursor(&letter)).unwrap();
        assert_eq!((at, id.as_str()), (7, "a.b/é%2F"));
        assert!(decode_cursor("garbage").is_err());
        assert!(decode_cursor("1.zz").is_err());
    }
}
