//! Extractors whose rejections are problem+json like every other error.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::http::error::{ApiError, ProblemCode};

/// A JSON body; unknown fields, wrong types and oversized bodies are refused.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    /// Read plainly first: `axum::Json` tracks the path of every value it
    /// reads (for its error messages), which costs as much as the parse.
    /// Only a body that fails is read again by `axum::Json`, so a refusal is
    /// worded exactly as before; any `Content-Type` other than the plain one
    /// takes `axum::Json`'s own path.
    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let plain = request
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"));
        if !plain {
            let Json(value) = Json::<T>::from_request(request, state).await?;
            return Ok(Self(value));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(JsonRejection::from)?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Ok(Self(value)),
            Err(_) => Json::<T>::from_bytes(&bytes)
                .map(|Json(value)| Self(value))
                .map_err(ApiError::from),
        }
    }
}

/// Path parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Query parameters. Their text must be UTF-8 once percent-decoded: the
/// form decoder under `axum::extract::Query` would read `%FF` as U+FFFD and
/// answer for a value the client never sent.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if let Some(query) = parts.uri.query() {
            // A UTF-8 sequence never holds `&`, `=` or `+`, so the whole
            // query decodes as UTF-8 exactly when each name and value does.
            if percent_encoding::percent_decode_str(query)
                .decode_utf8()
                .is_err()
            {
                return Err(ApiError::validation(
                    ProblemCode::InvalidQuery,
                    "query parameters must be UTF-8 text once percent-decoded",
                ));
            }
        }
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}
