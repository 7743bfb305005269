//! One API error type: owns the status mapping and the problem+json body
//! (RFC 9457). A 5xx shows none of its internals: they travel on the
//! response to the request log line (`observe`), which logs them with the
//! request's id.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
mod problem;

pub use problem::{Problem, ProblemClass, ProblemCode};

use crate::domain::{ConflictKind, IdError, SettlementClaimValidationError, StoreError};

/// An error answered as problem+json.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: ProblemCode,
    class: ProblemClass,
    detail: String,
    internal: Option<Internal>,
    /// Seconds a client should wait before trying again (`Retry-After`).
    retry_after_s: Option<u64>,
}

/// What a 5xx answer hides from the client and the log must show.
#[derive(Debug, Clone)]
pub enum Internal {
    /// The database failed or is out of reach.
    Backend(String),
    /// A stored value is corrupt or would overflow.
    InvalidRecord(String),
    /// A panic or a broken invariant of settled's own.
    Fault(String),
}

impl ApiError {
    fn new(
        status: StatusCode,
        code: ProblemCode,
        class: ProblemClass,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code,
            class,
            detail: detail.into(),
            internal: None,
            retry_after_s: None,
        }
    }

    /// 422: a value breaks a bound.
    pub fn validation(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            code,
            ProblemClass::Validation,
            detail,
        )
    }

    /// 404.
    pub fn not_found(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, ProblemClass::NotFound, detail)
    }

    /// 401 or 403 with class `auth`.
    pub fn auth(status: StatusCode, code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(status, code, ProblemClass::Auth, detail)
    }

    /// 410: what was asked for existed and was deleted.
    pub fn gone(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, code, ProblemClass::NotFound, detail)
    }

    /// 409.
    pub fn conflict(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, ProblemClass::Conflict, detail)
    }

    /// 503 with class `backend` and `Retry-After: 1`; `internal` goes to
    /// the log only. Outages and failovers mostly last seconds, and every
    /// request settled answers so is safe to send again (docs/high-availability.md).
    pub fn unavailable(internal: &str) -> Self {
        let mut error = Self::not_ready("the database is unavailable; retry later");
        error.internal = Some(Internal::Backend(internal.to_owned()));
        error
    }

    /// 503 with class `backend`, `Retry-After: 1` and a detail the caller
    /// may read (no host names or driver text).
    pub fn not_ready(detail: impl Into<String>) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ProblemCode::BackendUnavailable,
            ProblemClass::Backend,
            detail,
        );
        error.retry_after_s = Some(1);
        error
    }

    /// 500 with class `internal`: a panic or a broken invariant, a bug
    /// rather than an outage, so not a 503 that clients retry without end;
    /// `internal` goes to the log only.
    pub fn internal(internal: impl Into<String>) -> Self {
        let mut error = Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ProblemCode::InternalError,
            ProblemClass::Internal,
            "settled failed internally (logged with this request's id); nothing is known to \
             have changed: retry a few times at most, then report it",
        );
        error.internal = Some(Internal::Fault(internal.into()));
        error
    }

    /// 504 with class `backend` and `Retry-After: 1`: the request ran past
    /// the server's time limit (the database was slow to answer), which a
    /// retry may not meet again.
    pub fn time_limit(limit: std::time::Duration) -> Self {
        let mut error = Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            ProblemCode::TimeLimitExceeded,
            ProblemClass::Backend,
            format!(
                "the request ran past the server's time limit of {} s; it may or may not have \
                 taken effect: retry later",
                limit.as_secs()
            ),
        );
        error.internal = Some(Internal::Backend("request time limit".to_owned()));
        error.retry_after_s = Some(1);
        error
    }

    /// 429 with class `capacity` and a `Retry-After`: a server limit is reached.
    pub fn at_capacity(code: ProblemCode, detail: impl Into<String>, retry_after_s: u64) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            code,
            ProblemClass::Capacity,
            detail,
        );
        error.retry_after_s = Some(retry_after_s);
        error
    }

    /// 400: not JSON, or nested deeper than the parser allows.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ProblemCode::MalformedJson,
            ProblemClass::Validation,
            detail,
        )
    }

    /// 415: a state-changing request not sent as JSON.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProblemCode::UnsupportedMediaType,
            ProblemClass::Validation,
            "send the request with Content-Type: application/json (every POST, PUT, PATCH and \
             DELETE; a request without a body, such as a redrive, too)",
        )
    }

    /// The status this error answers with.
    #[must_use]
    pub const fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem body.
    #[must_use]
    pub fn problem(&self) -> Problem {
        Problem {
            kind: "about:blank".to_owned(),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_owned(),
            class: self.class.to_owned(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Conflict { kind, detail } => {
                let code = match kind {
                    ConflictKind::LeaseMismatch => ProblemCode::LeaseConflict,
                    ConflictKind::LeaseExpired => ProblemCode::LeaseExpired,
                    ConflictKind::NotLeased => ProblemCode::ReceiptNotLeased,
                    ConflictKind::Finished => ProblemCode::ReceiptFinished,
                    ConflictKind::UnknownReceipt => ProblemCode::ReceiptUnknown,
                };
                Self::conflict(code, detail)
            }
            StoreError::InvalidRecord { detail } => {
                let mut error = Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ProblemCode::InvalidRecord,
                    ProblemClass::InvalidRecord,
                    "a stored value is corrupt or would overflow; nothing was changed",
                );
                error.internal = Some(Internal::InvalidRecord(detail));
                error
            }
            StoreError::Backend { detail, .. } => Self::unavailable(&detail),
            StoreError::Internal { detail } => Self::internal(detail),
        }
    }
}

impl From<SettlementClaimValidationError> for ApiError {
    fn from(error: SettlementClaimValidationError) -> Self {
        let code = match error {
            SettlementClaimValidationError::WorkerIdLength => ProblemCode::WorkerIdLength,
            SettlementClaimValidationError::WorkerIdText => ProblemCode::InvalidWorkerId,
            SettlementClaimValidationError::LeaseDuration => ProblemCode::LeaseDuration,
            SettlementClaimValidationError::ClaimBatch => ProblemCode::ClaimBatch,
        };
        Self::validation(code, error.to_string())
    }
}

impl ApiError {
    /// A bad receipt id (`what` names the field).
    pub fn bad_id(code: ProblemCode, what: &str, error: IdError) -> Self {
        Self::validation(code, format!("{what} {error}"))
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let text = rejection.body_text();
        match rejection {
            JsonRejection::JsonDataError(_) => Self::validation(ProblemCode::InvalidBody, text),
            JsonRejection::JsonSyntaxError(_) => Self::malformed(text),
            JsonRejection::MissingJsonContentType(_) => Self::unsupported_media_type(),
            other if body_timed_out(&other) => Self::new(
                StatusCode::REQUEST_TIMEOUT,
                ProblemCode::RequestTimeout,
                ProblemClass::Validation,
                "the request body stopped arriving; send the request again",
            ),
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ProblemCode::BodyTooLarge,
                ProblemClass::Validation,
                "request bodies are limited to 1 MiB",
            ),
            other => Self::new(
                other.status(),
                ProblemCode::InvalidBody,
                ProblemClass::Validation,
                text,
            ),
        }
    }
}

/// Whether reading the body failed because the client stopped sending it.
fn body_timed_out(rejection: &JsonRejection) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = error.source();
    }
    false
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::validation(ProblemCode::InvalidQuery, rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::validation(ProblemCode::InvalidPath, rejection.body_text())
    }
}

impl ApiError {
    /// Tell the request's span (if it is traced) what was refused.
    pub(super) fn note_span(&self) {
        if !crate::http::middleware::spans::active() {
            return;
        }
        if let Ok(serde_json::Value::String(code)) = serde_json::to_value(self.code) {
            crate::http::middleware::spans::note_problem(
                &code,
                self.class == ProblemClass::Conflict,
            );
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.note_span();
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response();
        if let Some(internal) = self.internal {
            response.extensions_mut().insert(internal);
        }
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        response
    }
}

/// Answer for any path the API does not have.
pub async fn no_route() -> ApiError {
    ApiError::not_found(ProblemCode::NotFound, "no such path")
}

/// Answer for a known path with a method it does not take.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ProblemCode::MethodNotAllowed,
        ProblemClass::Validation,
        "method not allowed on this path",
    )
}
