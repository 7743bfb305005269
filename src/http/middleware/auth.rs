//! Bearer tokens and roles. Tokens are compared in constant time (as SHA-256
//! digests, so their lengths do not leak either) and never logged. Which
//! roles each route admits is the route table of `access`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::http::error::{ApiError, ProblemCode};

mod access;

pub use access::{Access, MatchedRoute, RouteEntry, declared_roles, is_v1, operations};

/// The name of the bearer security scheme in the OpenAPI document.
pub const BEARER: &str = "bearer";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
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

    /// The role named `name` in `ROLE:TOKEN` and in the OpenAPI document.
    #[must_use]
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// Who sent a request: the role of the token presented and the name it was
/// configured with (`ROLE:NAME:TOKEN`), if any. Put in the request's
/// extensions by [`require_token`], so that handlers can record the name in
/// history, and told to the request log. Never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    pub name: Option<Arc<str>>,
    /// Which token: the first bytes of its digest, to count what each
    /// token holds open (src/http/middleware/stream_cap.rs). Never logged.
    token: [u8; 8],
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("role", &self.role)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Caller {
    /// Tells the caller's token apart from every other configured token.
    #[must_use]
    pub fn key(&self) -> [u8; 8] {
        self.token
    }
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
            let role = Role::named(role).ok_or_else(|| TokenError::Role(role.to_owned()))?;
            let (name, token) = name_and_token(rest);
            if !is_strong(token) {
                return Err(TokenError::Weak);
            }
            let digest = digest(token);
            let mut token = [0; 8];
            token.copy_from_slice(&digest[..8]);
            let caller = Caller {
                role,
                name: name.map(Arc::from),
                token,
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

/// What the token check needs: the configured tokens and who may call what.
#[derive(Clone, Debug)]
pub struct Guard {
    pub tokens: Tokens,
    pub access: Access,
}

/// Refuse `/v1` requests without a valid token (401) or with a role the
/// operation does not admit (403); let the others through with their
/// [`Caller`] attached. A path or method no operation has goes on to the
/// router's 404 or 405, once the token is known.
pub async fn require_token(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if guard.tokens.is_empty() || !is_v1(path) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let Some(caller) = presented.and_then(|t| guard.tokens.caller_of(t)) else {
        return unauthorized();
    };
    // `None` lets a valid token through to the router's 404/405: the table
    // holds exactly the router's `/v1` operations (both come from the same
    // `split_for_parts`, matched by the same matchit), so no handler runs.
    let allowed = match request.extensions().get::<MatchedRoute>() {
        Some(MatchedRoute(entry)) => entry
            .as_ref()
            .and_then(|e| e.allows(caller.role, request.method())),
        None => guard.access.allows(caller.role, request.method(), path),
    }
    .unwrap_or(true);
    // For the request log (observe), which runs outside this layer: told
    // now, so that a request the time limit cuts off still names its caller.
    if let Some(seen) = request.extensions().get::<SeenCaller>() {
        seen.tell(&caller);
    }
    if allowed {
        request.extensions_mut().insert(caller);
        next.run(request).await
    } else {
        ApiError::auth(
            StatusCode::FORBIDDEN,
            ProblemCode::Forbidden,
            "this token's role may not do that",
        )
        .into_response()
    }
}

/// Where [`require_token`] tells the request log who called:
/// shared with the request rather than returned on the response, which a
/// time limit may replace.
#[derive(Clone, Default)]
pub struct SeenCaller(std::sync::Arc<std::sync::OnceLock<Caller>>);

impl SeenCaller {
    pub fn tell(&self, caller: &Caller) {
        let _ = self.0.set(caller.clone());
    }

    /// The caller told, if any.
    #[must_use]
    pub fn caller(&self) -> Option<Caller> {
        self.0.get().cloned()
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
