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

use utoipa::openapi::OpenApi;
use utoipa::openapi::path::{Operation, PathItem};

use super::error::{ApiError, ProblemCode};

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

/// Every route template the app serves, with the roles each `/v1` operation
/// admits, read from the router's own OpenAPI document, where every handler
/// declares them where it is registered (`security(("bearer" = [ROLES]))` in
/// its `#[utoipa::path]`, role names as OpenAPI 3.1 allows for bearer
/// schemes). The router is the one list of routes: a `/v1` operation without
/// roles makes [`Access::of`] fail, so the server does not start and every
/// HTTP test fails. A request is matched against it once, by the request log
/// ([`super::observe`]), for both its metrics label and its roles
/// ([`MatchedRoute`]).
#[derive(Clone)]
pub struct Access(Arc<matchit::Router<Arc<RouteEntry>>>);

/// A route template, and the roles of its `/v1` operations by method (none
/// for routes outside `/v1`).
#[derive(Debug)]
pub struct RouteEntry {
    pub template: String,
    methods: Vec<MethodRoles>,
}

impl RouteEntry {
    /// Whether `role` may call `method` here; `None` when no operation of
    /// this route has the method (the router answers 405).
    #[must_use]
    pub fn allows(&self, role: Role, method: &Method) -> Option<bool> {
        // The router answers HEAD with the GET handler: it needs GET's roles.
        let method = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        let (_, roles) = self.methods.iter().find(|(m, _)| m == method)?;
        Some(roles.contains(&role))
    }
}

/// The route a request matched (`None`: no route), found once by the
/// request log and read by [`require_token`].
#[derive(Clone, Debug)]
pub struct MatchedRoute(pub Option<Arc<RouteEntry>>);

/// A method of a path and the roles it admits.
type MethodRoles = (Method, Vec<Role>);

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Access")
    }
}

/// The operations of a path item, with their methods.
pub fn operations(item: &PathItem) -> impl Iterator<Item = (Method, &Operation)> {
    [
        (Method::GET, &item.get),
        (Method::POST, &item.post),
        (Method::PUT, &item.put),
        (Method::PATCH, &item.patch),
        (Method::DELETE, &item.delete),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.as_ref().map(|o| (method, o)))
}

/// The roles an operation declares for the bearer scheme; an error when it
/// declares none, or a name that is not a role.
pub fn declared_roles(operation: &Operation) -> Result<Vec<Role>, String> {
    let requirements = serde_json::to_value(operation.security.as_deref().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let names: Vec<&str> = requirements
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.get(BEARER)?.as_array())
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .collect();
    if names.is_empty() {
        return Err(
            "declares no role: add security((\"bearer\" = [ROLES])) to its #[utoipa::path]"
                .to_owned(),
        );
    }
    names
        .into_iter()
        .map(|n| Role::named(n).ok_or_else(|| format!("`{n}` is not a role")))
        .collect()
}

/// Whether a path is under `/v1`, where tokens are required.
fn is_v1(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

impl Access {
    /// Every path of `doc`, with the roles of its `/v1` operations, and the
    /// `others` the app serves outside the document (no roles).
    pub fn of(doc: &OpenApi, others: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut routes = matchit::Router::new();
        for (path, item) in &doc.paths.paths {
            let methods = if is_v1(path) {
                operations(item)
                    .map(|(method, operation)| {
                        declared_roles(operation)
                            .map(|roles| (method.clone(), roles))
                            .map_err(|e| format!("{method} {path} {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            } else {
                Vec::new()
            };
            let entry = RouteEntry {
                template: path.clone(),
                methods,
            };
            routes
                .insert(path.clone(), Arc::new(entry))
                .map_err(|e| format!("{path}: {e}"))?;
        }
        for template in others {
            let entry = RouteEntry {
                template: template.clone(),
                methods: Vec::new(),
            };
            // A template the matcher refuses is left unlabelled, not fatal.
            let _ = routes.insert(template, Arc::new(entry));
        }
        Ok(Self(Arc::new(routes)))
    }

    /// The route `path` (as sent) matches, if any.
    #[must_use]
    pub fn lookup(&self, path: &str) -> Option<Arc<RouteEntry>> {
        self.0.at(path).ok().map(|m| m.value.clone())
    }

    /// Whether `role` may call `method path` (path as sent); `None` when no
    /// operation has this path and method (the router answers 404 or 405).
    #[must_use]
    pub fn allows(&self, role: Role, method: &Method, path: &str) -> Option<bool> {
        self.lookup(path)?.allows(role, method)
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
    /// token holds open (src/http/streams.rs). Never logged.
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
