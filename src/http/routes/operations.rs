//! Status for dashboards, service facts, health and readiness, the spec.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::{
    MAX_ID_BYTES, MAX_SETTLEMENT_CLAIM_BATCH, MAX_SETTLEMENT_LEASE_MS,
    MAX_SETTLEMENT_WORKER_ID_BYTES, RetryPolicy,
};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::ApiQuery;
use crate::http::middleware::auth::{Caller, Role};
use crate::http::wire::{BackendKind, StatusView};
use crate::http::wire::{MAX_BATCH_ITEMS, MAX_BODY_BYTES, MAX_OBSERVATION_BYTES, MAX_WAIT_MS};
use crate::store::postgres::WriterState;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(info))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Status parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// Receipts sampled per state: 1..=4096, default 256.
    pub limit: Option<usize>,
}

/// Counts per state, the age of the oldest due receipt, and samples.
#[utoipa::path(get, path = "/v1/status", security(("bearer" = ["reader", "operator"])), operation_id = "v1.status.get", tag = "operations",
    params(StatusQuery),
    responses(
        (status = 200, description = "The queue at a glance", body = StatusView),
        (status = 422, description = "Bad limit", body = Problem, content_type = "application/problem+json"),
    ))]
async fn status(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<StatusQuery>,
) -> Result<Json<StatusView>, ApiError> {
    let limit = query.limit.unwrap_or(256);
    if limit == 0 || limit > 4096 {
        return Err(ApiError::validation(
            ProblemCode::InvalidLimit,
            "limit must be 1..=4096",
        ));
    }
    let status = app.store.status_at_a_glance(app.now(), limit).await?;
    Ok(Json(status.into()))
}

/// Bounds a client must respect.
#[derive(Debug, Serialize, ToSchema)]
pub struct Limits {
    pub max_worker_id_bytes: usize,
    pub max_lease_ms: u64,
    pub max_claim_batch: usize,
    pub max_receipt_id_bytes: usize,
    pub max_observation_bytes: usize,
    pub max_body_bytes: usize,
    pub max_batch_items: usize,
    pub max_wait_ms: u64,
}

/// What this service is and how it is configured.
#[derive(Debug, Serialize, ToSchema)]
pub struct InfoOut {
    pub version: String,
    pub backend: BackendKind,
    /// 64 hex characters identifying the database (the ledger) behind this server.
    pub store_binding: String,
    pub retry_policy: RetryPolicy,
    pub limits: Limits,
    /// Who is asking: the role and name of the token sent. Absent on a
    /// server without tokens (loopback only), where every caller may do
    /// everything. A client (the dashboard) shows only what the role may do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<CallerOut>,
    /// PostgreSQL only: the servers of `--database-url` and the one this
    /// replica writes to (docs/high-availability.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseOut>,
}

/// Which PostgreSQL server takes this replica's writes.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatabaseOut {
    /// The host in use, `host:port` as `--database-url` names it.
    pub primary: String,
    /// False while the replica looks for a server that accepts writes
    /// (`/readyz` answers 503 meanwhile).
    pub writable: bool,
    /// How many times this replica moved its connections to a new writer
    /// since it started.
    pub failovers: u64,
    /// Every host of `--database-url`, in the order they are named.
    pub hosts: Vec<String>,
}

impl From<WriterState> for DatabaseOut {
    fn from(state: WriterState) -> Self {
        Self {
            primary: state.primary,
            writable: state.writable,
            failovers: state.failovers,
            hosts: state.hosts,
        }
    }
}

/// The token behind a request: its role, and its name when it was given
/// one (`--token ROLE:NAME:TOKEN`). Never the token.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallerOut {
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Version, backend, store binding, retry policy, limits, and the caller's role.
#[utoipa::path(get, path = "/v1/info", security(("bearer" = ["producer", "worker", "reader", "operator"])), operation_id = "v1.info.get", tag = "operations",
    responses((status = 200, description = "Service facts", body = InfoOut)))]
async fn info(State(app): State<AppState>, caller: Option<Extension<Caller>>) -> Json<InfoOut> {
    Json(InfoOut {
        caller: caller.map(|Extension(c)| CallerOut {
            role: c.role,
            name: c.name.map(|n| n.to_string()),
        }),
        database: app.store.writer().map(DatabaseOut::from),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        backend: app.store.backend().into(),
        store_binding: app.store.settlement_store_binding().to_hex(),
        retry_policy: app.policy,
        limits: Limits {
            max_worker_id_bytes: MAX_SETTLEMENT_WORKER_ID_BYTES,
            max_lease_ms: MAX_SETTLEMENT_LEASE_MS,
            max_claim_batch: MAX_SETTLEMENT_CLAIM_BATCH,
            max_receipt_id_bytes: MAX_ID_BYTES,
            max_observation_bytes: MAX_OBSERVATION_BYTES,
            max_body_bytes: MAX_BODY_BYTES,
            max_batch_items: MAX_BATCH_ITEMS,
            max_wait_ms: MAX_WAIT_MS,
        },
    })
}

/// Health or readiness.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthOut {
    pub status: HealthStatus,
}

/// `ok` from `/healthz` (the process is alive), `ready` from `/readyz` (its
/// database is reachable and migrated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
    Ready,
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", operation_id = "health.alive", tag = "operations",
    responses((status = 200, description = "Alive", body = HealthOut)))]
async fn healthz() -> Json<HealthOut> {
    Json(HealthOut {
        status: HealthStatus::Ok,
    })
}

/// The database is reachable, migrated, and takes writes.
#[utoipa::path(get, path = "/readyz", operation_id = "health.ready", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = HealthOut),
        (status = 503, description = "Not ready", body = Problem, content_type = "application/problem+json"),
    ))]
async fn readyz(State(app): State<AppState>) -> Result<Json<HealthOut>, ApiError> {
    // A replica that cannot write must leave its load balancer's rotation,
    // though its database still answers reads.
    if let Some(WriterState {
        writable: false,
        reason,
        ..
    }) = app.store.writer()
    {
        let reason = reason.unwrap_or_else(|| "the database takes no writes".into());
        return Err(ApiError::not_ready(format!("not ready: {reason}")));
    }
    if let Err(error) = app.store.ping().await {
        return Err(match app.store.writer() {
            Some(WriterState {
                writable: false,
                reason: Some(reason),
                ..
            }) => ApiError::not_ready(format!("not ready: {reason}")),
            _ => error.into(),
        });
    }
    Ok(Json(HealthOut {
        status: HealthStatus::Ready,
    }))
}

/// The committed OpenAPI document, as YAML.
pub async fn openapi_yaml(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        app.openapi_yaml.to_string(),
    )
}
