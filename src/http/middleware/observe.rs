//! Per-request id, log line and metrics. An incoming `x-request-id` is kept
//! when it is short printable ASCII (so it cannot forge log lines), otherwise
//! a fresh one is made; either way it is returned on the response.
//!
//! One log line per request, with no `tracing` span around the handler: a
//! span costs as much as the line itself on every request. An OpenTelemetry
//! span is made only when traces are exported (`spans`). What a 5xx hides from the
//! client comes back on the response ([`Internal`]) and is logged here, on a
//! line that carries the request's id.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;

use crate::http::error::Internal;
use crate::http::middleware::auth::{Access, Caller, MatchedRoute, SeenCaller};
use crate::http::middleware::metrics::SharedMetrics;
use crate::http::middleware::spans;
use crate::telemetry::SharedTelemetry;

const HEADER: &str = "x-request-id";

/// The route label of a request no route matched.
const UNMATCHED: &str = "unmatched";

/// The method label: a standard method by name, anything else `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

fn incoming_id(request: &Request) -> Option<String> {
    let value = request.headers().get(HEADER)?.to_str().ok()?;
    let ok = !value.is_empty() && value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| value.to_owned())
}

fn new_id() -> String {
    let mut bytes = [0u8; 12];
    // An id only needs to be unique enough to find a request in the logs.
    if getrandom::fill(&mut bytes).is_err() {
        return "unavailable".to_owned();
    }
    hex::encode(bytes)
}

/// Who sent the request, for the log: `ROLE:NAME` for a named token, `ROLE`
/// for an unnamed one, `-` without a token. Never the token itself.
fn actor(caller: Option<Caller>) -> String {
    match caller {
        None => "-".to_owned(),
        Some(Caller {
            role, name: None, ..
        }) => role.as_str().to_owned(),
        Some(Caller {
            role,
            name: Some(name),
            ..
        }) => format!("{}:{name}", role.as_str()),
    }
}

/// What [`observe`] reports to: the metrics, and the trace exporter when
/// tracing is on.
#[derive(Clone)]
pub struct Observer {
    pub metrics: SharedMetrics,
    pub telemetry: Option<SharedTelemetry>,
    /// The app's routes: a request is matched once, here, for its metrics
    /// label and (through [`MatchedRoute`]) its roles. This middleware runs
    /// around the router (see `app`), where axum's `MatchedPath` is not
    /// known yet.
    pub routes: Access,
}

/// Wrap every request.
pub async fn observe(
    State(Observer {
        metrics,
        telemetry,
        routes,
    }): State<Observer>,
    mut request: Request,
    next: Next,
) -> Response {
    let id = incoming_id(&request).unwrap_or_else(new_id);
    // Labels come from closed sets: any token is a valid HTTP method and any
    // path can be sent, so labelling by what the client wrote would let it
    // grow the metrics without bound.
    let method = method_label(request.method());
    let matched = routes.lookup(request.uri().path());
    let route = matched
        .as_deref()
        .map_or(UNMATCHED, |m| m.template.as_str());
    request
        .extensions_mut()
        .insert(MatchedRoute(matched.clone()));
    let seen = SeenCaller::default();
    request.extensions_mut().insert(seen.clone());
    // Passed on with the request when it is forwarded to another replica
    // (forward.rs), whose log then names the same id.
    if let Ok(value) = HeaderValue::from_str(&id) {
        request.headers_mut().insert(HEADER, value);
    }
    let started = Instant::now();
    let mut response = match &telemetry {
        None => next.run(request).await,
        Some(telemetry) => {
            // Read before the request moves on: only the two headers, not a copy of all.
            let own_parent = spans::request_parent(request.headers());
            let labels = spans::RequestLabels {
                method,
                route,
                request_id: &id,
            };
            spans::traced(telemetry, own_parent, labels, next.run(request)).await
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let status = response.status().as_u16();
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, value);
    }
    // A request sent on is counted once, by the replica that served it.
    if response
        .extensions()
        .get::<super::forward::SentOn>()
        .is_none()
    {
        metrics.request(method, route, status, seconds);
    }
    let latency_ms = seconds * 1000.0;
    let caller = actor(seen.caller());
    match response.extensions_mut().remove::<Internal>() {
        None => {
            tracing::info!(request_id = %id, method, route, status, latency_ms, caller, "request");
        }
        Some(Internal::Backend(error)) => tracing::error!(
            request_id = %id, method, route, status, latency_ms, caller, error, "backend failure"
        ),
        Some(Internal::InvalidRecord(error)) => tracing::error!(
            request_id = %id, method, route, status, latency_ms, caller, error, "invalid record"
        ),
        Some(Internal::Fault(error)) => tracing::error!(
            request_id = %id, method, route, status, latency_ms, caller, error, "internal fault"
        ),
    }
    response
}
