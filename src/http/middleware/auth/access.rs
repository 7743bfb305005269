//! The route table: every route template the app serves, and the roles each
//! `/v1` operation admits.

use std::sync::Arc;

use axum::http::Method;
use utoipa::openapi::OpenApi;
use utoipa::openapi::path::{Operation, PathItem};

use super::{BEARER, Role};

/// Every route template the app serves, with the roles each `/v1` operation
/// admits, read from the router's own OpenAPI document, where every handler
/// declares them where it is registered (`security(("bearer" = [ROLES]))` in
/// its `#[utoipa::path]`, role names as OpenAPI 3.1 allows for bearer
/// schemes). The router is the one list of routes: a `/v1` operation without
/// roles makes [`Access::of`] fail, so the server does not start and every
/// HTTP test fails. A request is matched against it once, by the request log
/// ([`crate::http::middleware::observe`]), for both its metrics label and its roles
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
pub fn is_v1(path: &str) -> bool {
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
