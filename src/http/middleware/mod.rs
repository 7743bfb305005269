//! What wraps every request: the token check, the host and origin guard,
//! the request log, metrics and spans, the time limit, and the cap on event
//! streams.

pub mod auth;
pub mod forward;
pub mod metrics;
pub mod observe;
pub mod origin;
pub mod spans;
pub mod stream_cap;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::REQUEST_TIMEOUT;
use super::error::ApiError;

pub async fn time_limit(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::time_limit(REQUEST_TIMEOUT).into_response(),
    }
}

pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    ApiError::internal(format!("handler panicked: {message}")).into_response()
}
