//! The HTTP API: the state every handler shares and the application, its
//! routes (`routes`, one module per resource) wrapped in the middleware
//! (`middleware`) once. Request and response bodies are in `wire`.

pub mod error;
mod extract;
mod long_polls;
pub mod middleware;
mod openapi;
pub mod rate_counts;
mod routes;
mod strict_json;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use utoipa_swagger_ui::SwaggerUi;

use crate::clock::Clock;
use crate::domain::RetryPolicy;
use crate::store::SharedStore;
use error::ApiError;
pub use middleware::stream_cap::StreamLimits;
use middleware::{auth, metrics, observe, origin, spans, stream_cap};
pub use openapi::{openapi, openapi_yaml};
pub use routes::history::{Hold, KeepBusy};

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
    waits: Arc<long_polls::Waits>,
    stats: Arc<rate_counts::Recorder>,
    stats_every: Duration,
    streams: Arc<stream_cap::Streams>,
    telemetry: Option<crate::telemetry::SharedTelemetry>,
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
        let yaml = openapi_yaml();
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
            stats: Arc::default(),
            stats_every: rate_counts::FLUSH_EVERY,
            streams: Arc::default(),
            telemetry: None,
        }
    }

    /// Export a span per request (src/telemetry.rs).
    #[must_use]
    pub fn with_telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> Self {
        self.telemetry = Some(Arc::new(telemetry));
        self
    }

    /// The counters a trace exporter reports to `/metrics`: spans dropped,
    /// spans exported.
    #[must_use]
    pub fn trace_counters(&self) -> (Counter, Counter) {
        self.metrics.trace_counters()
    }

    /// Cap the event streams open at once (default [`StreamLimits::default`]).
    #[must_use]
    pub fn with_stream_limits(mut self, limits: StreamLimits) -> Self {
        self.streams = Arc::new(stream_cap::Streams::new(limits));
        self
    }

    /// Add this server's rate counts to the database every `every`
    /// (default [`rate_counts::FLUSH_EVERY`]) while it serves.
    #[must_use]
    pub fn with_stats_every(mut self, every: Duration) -> Self {
        self.stats_every = every;
        self
    }

    /// How often this server adds its rate counts to the database.
    #[must_use]
    pub const fn stats_every(&self) -> Duration {
        self.stats_every
    }

    /// Add this server's rate counts to the database now (the server does
    /// it every [`Self::stats_every`] and once more when it stops).
    pub async fn flush_stats(&self) -> crate::store::StoreResult<()> {
        rate_counts::flush(self).await
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
    pub fn now(&self) -> crate::domain::UnixMs {
        self.clock.now()
    }

    /// Turn a store result into an API result, counting refused writes.
    fn checked<T>(&self, result: crate::store::StoreResult<T>) -> Result<T, ApiError> {
        result.map_err(|e| {
            if e.class() == crate::domain::StoreErrorClass::Conflict {
                self.metrics.conflict();
                self.tally(&crate::store::StatsCounts {
                    conflicts: 1,
                    ..Default::default()
                });
            }
            let error = ApiError::from(e);
            error.note_span();
            error
        })
    }

    /// [`Self::checked`], counting the committed route of `input` (the
    /// outcome of `claim`) too.
    fn count(
        &self,
        result: crate::store::StoreResult<crate::domain::Route>,
        claim: &crate::domain::Claim,
        input: &crate::domain::Outcome,
    ) -> Result<crate::domain::Route, ApiError> {
        let route = self.checked(result)?;
        spans::note_route(&route);
        self.metrics.routed(claim, input, &route, self.now().get());
        self.tally(&rate_counts::routed(input, &route));
        Ok(route)
    }

    /// Count `delta` in the rates of the current minute (`GET /v1/stats`).
    fn tally(&self, delta: &crate::store::StatsCounts) {
        self.stats.add(self.now().get(), delta);
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn shutdown_signal(&self) {
        let mut rx = self.shutdown.clone();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Paths served outside the OpenAPI document.
const OPENAPI_YAML: &str = "/openapi.yaml";
const OPENAPI_JSON: &str = "/openapi.json";
const METRICS: &str = "/metrics";
const DASHBOARD: &str = "/";
const DOCS: &str = "/docs";

/// The route templates the app serves outside its OpenAPI document (their
/// metrics' route labels).
fn other_templates() -> Vec<String> {
    let mut templates = Vec::new();
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
    let telemetry = state.telemetry.clone();
    // Only an anonymous server can be reached through DNS rebinding: with
    // tokens, a page cannot present one, so any name is answered.
    let hosts = if tokens.is_empty() {
        state.allowed_hosts.clone()
    } else {
        origin::AllowedHosts::any()
    };
    let forwarder =
        middleware::forward::Forwarder::new(state.store.clone(), state.shutdown.clone());
    let (router, doc) = routes::api_router().split_for_parts();
    let access =
        auth::Access::of(&doc, other_templates()).expect("every /v1 operation declares its roles");
    let guard = auth::Guard {
        tokens: tokens.clone(),
        access: access.clone(),
    };
    let routes = router
        .route(OPENAPI_YAML, get(routes::operations::openapi_yaml))
        .route(METRICS, get(metrics::metrics))
        .route(DASHBOARD, get(routes::dashboard::page))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .with_state(state)
        .merge(SwaggerUi::new(DOCS).url(OPENAPI_JSON, openapi()));
    // The layers wrap the router once, outermost first, rather than each
    // route (`Router::layer`): axum clones a route's whole layered stack, a
    // boxed service per layer, on every request it serves.
    let layered = ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(
            observe::Observer {
                metrics,
                telemetry,
                routes: access,
            },
            observe::observe,
        ))
        .layer(axum::middleware::from_fn_with_state(hosts, origin::guard))
        .layer(CatchPanicLayer::custom(middleware::panic_response))
        .layer(CompressionLayer::new())
        .layer(axum::middleware::from_fn(middleware::time_limit))
        .layer(DefaultBodyLimit::max(wire::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            guard,
            auth::require_token,
        ))
        // Before the body's read timeout, which changes the body's type; the
        // request's own time limit bounds a body sent on.
        .layer(axum::middleware::from_fn_with_state(
            forwarder,
            middleware::forward::forward,
        ))
        .layer(RequestBodyTimeoutLayer::new(BODY_READ_TIMEOUT))
        .service(routes);
    Router::new().fallback_service(layered)
}
