//! The HTTP API: routes composed in one place, each module owning its own.

pub mod auth;
mod claims;
mod dashboard;
mod dead_letters;
pub mod error;
mod extract;
pub mod metrics;
mod observe;
mod ops;
pub mod origin;
mod outcomes;
mod receipts;
mod strict_json;
mod waiting;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::clock::Clock;
use crate::domain::RetryPolicy;
use crate::store::SharedStore;
use error::ApiError;

/// Longest time any request may take; above the longest long-poll wait.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for the next piece of a request body: a client that stops
/// sending its body part-way gets 408 instead of holding the request open.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: SharedStore,
    pub policy: RetryPolicy,
    pub clock: Arc<dyn Clock>,
    shutdown: watch::Receiver<bool>,
    openapi_yaml: Arc<str>,
    tokens: auth::Tokens,
    allowed_hosts: origin::AllowedHosts,
    metrics: metrics::SharedMetrics,
    waits: Arc<waiting::Waits>,
}

impl AppState {
    /// State for one server; `shutdown` turning true ends long-poll waits early.
    #[must_use]
    pub fn new(
        store: SharedStore,
        policy: RetryPolicy,
        clock: Arc<dyn Clock>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let yaml = openapi().to_yaml().unwrap_or_default();
        Self {
            store,
            policy,
            clock,
            shutdown,
            openapi_yaml: yaml.into(),
            tokens: auth::Tokens::default(),
            allowed_hosts: origin::AllowedHosts::loopback(),
            metrics: Arc::default(),
            waits: Arc::default(),
        }
    }

    /// Require these bearer tokens on `/v1` (none: anonymous access).
    #[must_use]
    pub fn with_tokens(mut self, tokens: auth::Tokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// Without tokens, answer requests addressed to these host names only
    /// (default: loopback names). With tokens any name is answered.
    #[must_use]
    pub fn with_allowed_hosts(mut self, hosts: origin::AllowedHosts) -> Self {
        self.allowed_hosts = hosts;
        self
    }

    /// The server clock.
    #[must_use]
    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Turn a store result into an API result, counting refused writes.
    fn checked<T>(&self, result: crate::store::StoreResult<T>) -> Result<T, ApiError> {
        result.map_err(|e| {
            if e.class() == crate::domain::SettlementRouteErrorClass::Conflict {
                self.metrics.conflict();
            }
            ApiError::from(e)
        })
    }

    /// [`Self::checked`], counting committed routes too.
    fn count(
        &self,
        result: crate::store::StoreResult<crate::domain::SettlementRoute>,
    ) -> Result<crate::domain::SettlementRoute, ApiError> {
        let route = self.checked(result)?;
        self.metrics.routed(&route);
        Ok(route)
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn shutdown_signal(&self) {
        let mut rx = self.shutdown.clone();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

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
        (name = "operations", description = "Status, facts, health")
    )
)]
struct ApiDoc;

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(receipts::routes())
        .merge(claims::routes())
        .merge(outcomes::routes())
        .merge(dead_letters::routes())
        .merge(ops::routes())
}

/// The OpenAPI document, derived from the routes themselves.
#[must_use]
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_router().into_openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document_body_problems(&mut doc);
    doc
}

/// Add the answers every state-changing operation can give before its
/// handler runs: the cross-site checks of [`origin::guard`] and, for those
/// with a JSON body, the body problems of [`error::ApiError`]'s
/// `From<JsonRejection>`.
fn document_body_problems(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    const BODY_PROBLEMS: [(&str, &str); 3] = [
        ("400", "Malformed JSON (`malformed_json`)"),
        (
            "408",
            "The request body stopped arriving (`request_timeout`)",
        ),
        ("413", "Body over 1 MiB (`body_too_large`)"),
    ];
    const REQUEST_PROBLEMS: [(&str, &str); 2] = [
        (
            "403",
            "Sent by a browser from another site or origin (`cross_site_request`)",
        ),
        (
            "415",
            "Not sent with `Content-Type: application/json` (`unsupported_media_type`); \
             required on every POST and DELETE, with or without a body",
        ),
    ];
    for item in doc.paths.paths.values_mut() {
        for operation in [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            let body = if operation.request_body.is_some() {
                &BODY_PROBLEMS[..]
            } else {
                &[]
            };
            for (status, description) in body.iter().chain(&REQUEST_PROBLEMS) {
                let problem = ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build();
                let response = ResponseBuilder::new()
                    .description(*description)
                    .content("application/problem+json", problem)
                    .build();
                operation
                    .responses
                    .responses
                    .entry((*status).to_owned())
                    .or_insert(RefOr::T(response));
            }
        }
    }
}

async fn time_limit(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::unavailable("request timed out").into_response(),
    }
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::unavailable("handler panicked").into_response()
}

/// Paths served outside the OpenAPI document.
const OPENAPI_YAML: &str = "/openapi.yaml";
const OPENAPI_JSON: &str = "/openapi.json";
const METRICS: &str = "/metrics";
const DASHBOARD: &str = "/";
const DOCS: &str = "/docs";

/// Every route template the app serves (the metrics' route labels).
fn route_templates() -> Vec<String> {
    let mut templates: Vec<String> = api_router()
        .into_openapi()
        .paths
        .paths
        .into_keys()
        .collect();
    // The Swagger UI's own routes are those `SwaggerUi::new(DOCS)` adds.
    templates.extend(
        [OPENAPI_YAML, OPENAPI_JSON, METRICS, DASHBOARD, DOCS]
            .into_iter()
            .map(str::to_owned),
    );
    templates.extend([format!("{DOCS}/"), format!("{DOCS}/{{*rest}}")]);
    templates
}

/// The whole application.
pub fn app(state: AppState) -> Router {
    let tokens = state.tokens.clone();
    let metrics = state.metrics.clone();
    // Only an anonymous server can be reached through DNS rebinding: with
    // tokens, a page cannot present one, so any name is answered.
    let hosts = if tokens.is_empty() {
        state.allowed_hosts.clone()
    } else {
        origin::AllowedHosts::any()
    };
    let (router, _) = api_router().split_for_parts();
    let routes = router
        .route(OPENAPI_YAML, get(ops::openapi_yaml))
        .route(METRICS, get(metrics::metrics))
        .route(DASHBOARD, get(dashboard::page))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .with_state(state)
        .merge(SwaggerUi::new(DOCS).url(OPENAPI_JSON, openapi()));
    // The layers wrap the router once, outermost first, rather than each
    // route (`Router::layer`): axum clones a route's whole layered stack, a
    // boxed service per layer, on every request it serves.
    let layered = ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(metrics, observe::observe))
        .layer(middleware::from_fn_with_state(hosts, origin::guard))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(CompressionLayer::new())
        .layer(middleware::from_fn(time_limit))
        .layer(DefaultBodyLimit::max(wire::MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(tokens, auth::require_token))
        .layer(RequestBodyTimeoutLayer::new(BODY_READ_TIMEOUT))
        .service(routes);
    Router::new().fallback_service(layered)
}
