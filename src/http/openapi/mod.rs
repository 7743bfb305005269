//! The OpenAPI document: derived from the routes' own annotations, then
//! completed (`refine`) with what they cannot say.

mod examples;
mod refine;

use utoipa::OpenApi;

use super::routes::api_router;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "settled",
        description = "Settles payment receipts reliably: producers enqueue receipts, workers claim them \
            under a lease and report outcomes, and the service routes each outcome atomically \
            (done, retry later with backoff, or dead-letter). Every error is application/problem+json \
            with a stable `code` and a `class`."
    ),
    tags(
        (name = "receipts", description = "Enqueue and inspect receipts"),
        (name = "claims", description = "Lease due work"),
        (name = "outcomes", description = "Report outcomes; extend or release leases"),
        (name = "dead letters", description = "Inspect and redrive failed receipts"),
        (name = "operator actions", description = "Hold, unhold and cancel receipts; act on many at once"),
        (name = "history", description = "Follow every history entry in commit order"),
        (name = "operations", description = "Status, facts, health")
    ),
    // Used only as a query parameter, which does not register its schema.
    components(schemas(crate::http::wire::SearchOrder))
)]
pub struct ApiDoc;

/// The OpenAPI document as YAML: what `openapi.yaml` holds and `/openapi.yaml`
/// serves. Rendered from its JSON text because, with serde_json's
/// `arbitrary_precision`, the numbers of the request examples serialize as
/// numbers only through serde_json itself.
#[must_use]
pub fn openapi_yaml() -> String {
    let json = serde_json::to_string(&openapi()).expect("the document serializes");
    let value: yaml_serde::Value = yaml_serde::from_str(&json).expect("JSON text is YAML");
    yaml_serde::to_string(&value).expect("the document renders as YAML")
}

/// The OpenAPI document, derived from the routes themselves.
#[must_use]
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_router().into_openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    refine::refine(&mut doc);
    doc
}
