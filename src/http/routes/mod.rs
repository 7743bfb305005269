//! The routes of the OpenAPI document, one module per resource, each owning
//! its handlers and their annotations.

pub mod actions;
pub mod claims;
pub mod dashboard;
pub mod dead_letters;
pub mod groups;
pub mod history;
pub mod operations;
pub mod outcomes;
pub mod rates;
pub mod receipts;

use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use super::AppState;
use super::openapi::ApiDoc;

/// Every documented route, on the document's head (info, tags).
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(receipts::routes())
        .merge(receipts::search::routes())
        .merge(claims::routes())
        .merge(groups::routes())
        .merge(outcomes::routes())
        .merge(dead_letters::routes())
        .merge(actions::routes())
        .merge(actions::bulk::routes())
        .merge(operations::routes())
        .merge(history::routes())
        .merge(rates::routes())
}
