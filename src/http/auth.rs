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

/// Who sent a request: the role of the token presented and the name it was
/// configured with (`ROLE:NAME:TOKEN`), if any. Put in the request's and the
/// response's extensions by [`require_token`], so that handlers can record
/// the name in history and the request log can print it. Never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    pub name: Option<Arc<str>>,
}

/// A `ROLE:TOKEN` or `ROLE:NAME:TOKEN` that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    #[error(
        "a token must be given as ROLE:TOKEN or ROLE:NAME:TOKEN with ROLE one of producer, worker, reader, operator"
    )]
    Shape,
    #[error("unknown role `{0}`: use producer, worker, reader or operator")]
    Role(String),
    #[error("a token must be 16..=256 visible ASCII characters")]
    Weak,
    #[error("the same token is configured with two roles or names")]
    Repeated,
}

/// Whether `name` may name a token: 1..=64 ASCII letters, digits, `.`, `_`, `-`.
fn is_token_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn is_strong(token: &str) -> bool {
    (16..=256).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic())
}

/// Split what follows `ROLE:` into an optional name and the token. The
/// three-part form wins when both of its parts are valid; otherwise the whole
/// rest is the token (the two-part form, whose token may hold a `:`).
fn name_and_token(rest: &str) -> (Option<&str>, &str) {
    match rest.split_once(':') {
        Some((name, token)) if is_token_name(name) && is_strong(token) => (Some(name), token),
        _ => (None, rest),
    }
}

/// The configured tokens; empty means anonymous access.
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<([u8; 32], Caller)>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured, redacted)", self.0.len())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parse `ROLE:TOKEN` and `ROLE:NAME:TOKEN` entries.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, TokenError> {
        let mut tokens: Vec<([u8; 32], Caller)> = Vec::new();
        for entry in entries {
            let (role, rest) = entry
                .as_ref()
                .trim()
                .split_once(':')
                .ok_or(TokenError::Shape)?;
            let role = Role::ALL
                .into_iter()
                .find(|r| r.as_str() == role)
                .ok_or_else(|| TokenError::Role(role.to_owned()))?;
            let (name, token) = name_and_token(rest);
            if !is_strong(token) {
                return Err(TokenError::Weak);
            }
            let digest = digest(token);
            let caller = Caller {
                role,
                name: name.map(Arc::from),
            };
            // One token with two roles or names would make the caller ambiguous.
            if tokens.iter().any(|(k, c)| *k == digest && *c != caller) {
                return Err(TokenError::Repeated);
            }
            tokens.push((digest, caller));
        }
        Ok(Self(Arc::new(tokens)))
    }

    /// No tokens: anonymous access.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Who presents this token, checking every configured token in constant time.
    #[must_use]
    pub fn caller_of(&self, presented: &str) -> Option<Caller> {
        let presented = digest(presented);
        let mut found = None;
        for (known, caller) in self.0.iter() {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(caller);
            }
        }
        found.cloned()
    }

    /// The role of a presented token.
    #[must_use]
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        self.caller_of(presented).map(|c| c.role)
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

/// Refuse `/v1` requests without a valid token (401) or with a role that may
/// not (403); let the others through with their [`Caller`] attached.
pub async fn require_token(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if tokens.is_empty() || !(path == "/v1" || path.starts_with("/v1/")) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let Some(caller) = presented.and_then(|t| tokens.caller_of(t)) else {
        return unauthorized();
    };
    let mut response = if caller.role.may(request.method(), path) {
        request.extensions_mut().insert(caller.clone());
        next.run(request).await
    } else {
        ApiError::auth(
            StatusCode::FORBIDDEN,
            ProblemCode::Forbidden,
            "this token's role may not do that",
        )
        .into_response()
    };
    // For the request log (observe), which runs outside this layer.
    response.extensions_mut().insert(caller);
    response
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
    fn tokens_may_carry_a_name() {
        let t = Tokens::parse(&[
            "operator:alice:0123456789abcdef",
            "reader:0123:456789abcdef",
        ])
        .unwrap();
        let alice = t.caller_of("0123456789abcdef").unwrap();
        assert_eq!(
            (alice.role, alice.name.as_deref()),
            (Role::Operator, Some("alice"))
        );
        // Not both parts valid (the rest is too short to be a token): the
        // whole rest is the token, as before names existed.
        assert_eq!(t.role_of("0123:456789abcdef"), Some(Role::Reader));
        assert_eq!(t.caller_of("0123:456789abcdef").unwrap().name, None);
        assert_eq!(
            Tokens::parse(&["worker:bob:short"]).err(),
            Some(TokenError::Weak)
        );
        assert_eq!(
            Tokens::parse(&["operator:a:0123456789abcdef", "reader:b:0123456789abcdef"]).err(),
            Some(TokenError::Repeated)
        );
        assert!(!format!("{t:?}").contains("alice"));
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
