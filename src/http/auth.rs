//! Bearer tokens and roles. Tokens are compared in constant time (as SHA-256
//! digests, so their lengths do not leak either) and never logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;

use super::error::{ApiError, ProblemCode};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Enqueue, read receipts and info.
    Producer,
    /// Claim, report outcomes, extend and release leases, read receipts and info.
    Worker,
    /// Every GET under /v1.
    Reader,
    /// Everything, redrive included.
    Operator,
}

impl Role {
    /// Every role.
    pub const ALL: [Self; 4] = [Self::Producer, Self::Worker, Self::Reader, Self::Operator];

    /// The role's name in `ROLE:TOKEN`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Producer => "producer",
            Self::Worker => "worker",
            Self::Reader => "reader",
            Self::Operator => "operator",
        }
    }

    /// Whether this role may call `method path` (path as sent, percent-encoded).
    #[must_use]
    pub fn may(self, method: &Method, path: &str) -> bool {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let get = method == Method::GET;
        let post = method == Method::POST;
        let shared = matches!(
            (get, segments.as_slice()),
            (true, ["v1", "info"] | ["v1", "receipts", _])
        );
        match self {
            Self::Operator => true,
            Self::Reader => get,
            Self::Producer => {
                shared
                    || (post
                        && matches!(
                            segments.as_slice(),
                            ["v1", "receipts"] | ["v1", "receipts", "batch"]
                        ))
            }
            Self::Worker => {
                shared
                    || (post
                        && matches!(
                            segments.as_slice(),
                            ["v1", "claims"]
                                | ["v1", "outcomes"]
                                | ["v1", "receipts", _, "claim" | "outcome" | "lease"]
                        ))
                    || (method == Method::DELETE
                        && matches!(segments.as_slice(), ["v1", "receipts", _, "lease"]))
            }
        }
    }
}

/// A `ROLE:TOKEN` that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    #[error(
        "a token must be given as ROLE:TOKEN with ROLE one of producer, worker, reader, operator"
    )]
    Shape,
    #[error("unknown role `{0}`: use producer, worker, reader or operator")]
    Role(String),
    #[error("a token must be 16..=256 visible ASCII characters")]
    Weak,
}

/// The configured tokens; empty means anonymous access.
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<([u8; 32], Role)>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured, redacted)", self.0.len())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parse `ROLE:TOKEN` entries.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, TokenError> {
        let mut tokens = Vec::new();
        for entry in entries {
            let (role, token) = entry
                .as_ref()
                .trim()
                .split_once(':')
                .ok_or(TokenError::Shape)?;
            let role = Role::ALL
                .into_iter()
                .find(|r| r.as_str() == role)
                .ok_or_else(|| TokenError::Role(role.to_owned()))?;
            if token.len() < 16 || token.len() > 256 || !token.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(TokenError::Weak);
            }
            tokens.push((digest(token), role));
        }
        Ok(Self(Arc::new(tokens)))
    }

    /// No tokens: anonymous access.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The role of a presented token, checking every configured token in constant time.
    #[must_use]
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        let presented = digest(presented);
        let mut found = None;
        for (known, role) in self.0.iter() {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(*role);
            }
        }
        found
    }
}

fn unauthorized() -> Response {
    let mut response = ApiError::auth(
        StatusCode::UNAUTHORIZED,
        ProblemCode::Unauthorized,
        "send a valid token as Authorization: Bearer <token>",
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

/// The token of an `Authorization: Bearer <token>` value. The scheme name is
/// case-insensitive (RFC 9110, section 11.1): `bearer` and `BEARER` work too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Refuse `/v1` requests without a valid token (401) or with a role that may not (403).
pub async fn require_token(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if tokens.is_empty() || !(path == "/v1" || path.starts_with("/v1/")) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let Some(role) = presented.and_then(|t| tokens.role_of(t)) else {
        return unauthorized();
    };
    if !role.may(request.method(), path) {
        return ApiError::auth(
            StatusCode::FORBIDDEN,
            ProblemCode::Forbidden,
            "this token's role may not do that",
        )
        .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_and_refuse_bad_entries() {
        let t = Tokens::parse(&["worker:0123456789abcdef", "operator:fedcba9876543210"]).unwrap();
        assert_eq!(t.role_of("0123456789abcdef"), Some(Role::Worker));
        assert_eq!(t.role_of("fedcba9876543210"), Some(Role::Operator));
        assert_eq!(t.role_of("0123456789abcdeF"), None);
        assert_eq!(Tokens::parse(&["worker"]).unwrap_err(), TokenError::Shape);
        assert_eq!(
            Tokens::parse(&["admin:0123456789abcdef"]).unwrap_err(),
            TokenError::Role("admin".into())
        );
        assert_eq!(
            Tokens::parse(&["worker:short"]).unwrap_err(),
            TokenError::Weak
        );
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "BeArEr   abc "] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearer", "Bearer ", "Bearerabc", "abc"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
