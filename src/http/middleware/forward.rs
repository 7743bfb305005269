//! Claims and outcomes sent on to the replica of the database that does the
//! upkeep, when it advertised where it listens (`--advertise-url`,
//! src/store/postgres/upkeep.rs): that replica merges every replica's
//! requests into few statements and commits, so the database pays about the
//! same per receipt whether the work comes through one replica or several
//! (docs/scaling.md). The request is sent on as it came (its token
//! included: the holder checks it again) and its answer is passed back as
//! the holder gave it. A holder that cannot be reached is not asked again
//! for a second, and meanwhile this replica serves the requests itself, as
//! it would alone; a request sent on whose answer was lost is answered 503,
//! which the API documents as safe to send again. A request that was sent
//! on already is never sent on again, so two replicas that each think the
//! other holds the lock serve it rather than pass it back and forth.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::error::ApiError;
use crate::http::{REQUEST_TIMEOUT, wire};
use crate::store::SharedStore;

/// Set on a request sent on: the holder serves it, whoever it thinks holds.
pub const FORWARDED: &str = "settled-forwarded";

/// How long a holder that could not be reached is left alone.
const UNREACHABLE_FOR: Duration = Duration::from_secs(1);

/// Request headers not passed on: the connection's own, and the encodings
/// (this replica compresses the answer as it would its own).
const NOT_PASSED: [header::HeaderName; 7] = [
    header::HOST,
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::ACCEPT_ENCODING,
    header::TE,
    header::UPGRADE,
];

/// Marks an answer passed back from the holder, which counted the request
/// in its metrics.
#[derive(Clone, Copy)]
pub struct SentOn;

/// What the middleware needs: the store says who holds the upkeep.
#[derive(Clone)]
pub struct Forwarder {
    store: SharedStore,
    client: reqwest::Client,
    /// A holder that could not be reached, and since when.
    unreachable: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Forwarder {
    pub fn new(store: SharedStore) -> Self {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .connect_timeout(Duration::from_secs(1))
            .timeout(REQUEST_TIMEOUT + Duration::from_secs(5))
            .build()
            .expect("an HTTP client with no TLS settings builds");
        Self {
            store,
            client,
            unreachable: Arc::default(),
        }
    }

    /// Where `request` goes, if it is sent on: a worker's write (claims,
    /// outcomes, lease extensions and releases, which the holder merges),
    /// with a body of a known length within the limit (any other is served
    /// here, where it is refused as it would be there).
    fn holder_for(&self, request: &Request) -> Option<String> {
        let headers = request.headers();
        let length = match headers.get(header::CONTENT_LENGTH) {
            Some(v) => v.to_str().ok()?.parse::<usize>().ok()?,
            None if headers.contains_key(header::TRANSFER_ENCODING) => return None,
            None => 0,
        };
        if length > wire::MAX_BODY_BYTES
            || headers.contains_key(FORWARDED)
            || !worker_write(request.method(), request.uri().path())
        {
            return None;
        }
        let holder = self.store.forward_to()?;
        let unreachable = self.unreachable.lock().ok()?;
        match unreachable.as_ref() {
            Some((url, at)) if *url == holder && at.elapsed() < UNREACHABLE_FOR => None,
            _ => Some(holder),
        }
    }

    fn could_not_reach(&self, holder: String) {
        if let Ok(mut unreachable) = self.unreachable.lock() {
            *unreachable = Some((holder, Instant::now()));
        }
    }
}

/// The routes of a worker's writes, which the replicas' write queues merge.
fn worker_write(method: &Method, path: &str) -> bool {
    let per_receipt = |what: &str| {
        path.strip_prefix("/v1/receipts/")
            .and_then(|rest| rest.strip_suffix(what))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    match *method {
        Method::POST => {
            matches!(path, "/v1/claims" | "/v1/outcomes" | "/v1/leases/extend")
                || per_receipt("/outcome")
                || per_receipt("/claim")
                || per_receipt("/lease")
        }
        Method::DELETE => per_receipt("/lease"),
        _ => false,
    }
}

/// Send workers' writes on to the holder; serve everything else here.
pub async fn forward(State(f): State<Forwarder>, request: Request, next: Next) -> Response {
    let Some(holder) = f.holder_for(&request) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, wire::MAX_BODY_BYTES).await else {
        return ApiError::malformed("the request body could not be read").into_response();
    };
    let target = format!(
        "{holder}{}",
        parts.uri.path_and_query().map_or("", |p| p.as_str())
    );
    let mut headers = parts.headers.clone();
    for name in &NOT_PASSED {
        headers.remove(name);
    }
    let sent = f
        .client
        .request(parts.method.clone(), &target)
        .headers(headers)
        .header(FORWARDED, "1")
        .body(bytes.clone())
        .send()
        .await;
    match sent {
        Ok(answer) => passed_back(answer).await,
        // Nothing reached the holder: serve it here.
        Err(e) if e.is_connect() => {
            tracing::warn!(holder = %holder, error = %e, "cannot reach the replica doing the upkeep; serving here");
            f.could_not_reach(holder);
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => {
            ApiError::unavailable(&format!("the replica doing the upkeep: {e}")).into_response()
        }
    }
}

/// The holder's answer, as it gave it (but for the connection's headers).
async fn passed_back(answer: reqwest::Response) -> Response {
    let status = answer.status();
    let mut headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if name != header::CONNECTION
            && name != header::CONTENT_LENGTH
            && name != header::TRANSFER_ENCODING
        {
            headers.append(name.clone(), value.clone());
        }
    }
    match answer.bytes().await {
        Ok(body) => {
            let mut response = (status, headers, body).into_response();
            response.extensions_mut().insert(SentOn);
            response
        }
        Err(e) => {
            ApiError::unavailable(&format!("the replica doing the upkeep: {e}")).into_response()
        }
    }
}
