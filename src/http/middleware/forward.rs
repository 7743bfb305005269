//! Claims and outcomes sent on to the replica of the database that does the
//! upkeep, when it advertised where it listens (`--advertise-url`,
//! src/store/postgres/upkeep.rs): that replica merges every replica's
//! requests into few statements and commits, so the database pays about the
//! same per receipt whether the work comes through one replica or several
//! (docs/scaling.md). The request is sent on as it came (its token
//! included: the holder checks it again) and its answer is passed back as
//! the holder gave it. A holder that cannot be reached is not asked again
//! for a second, and meanwhile this replica serves the requests itself, as
//! it would alone; a request sent on whose answer was lost, or whose holder
//! was passed over while it waited (a stalled process), is answered 503,
//! which the API documents as safe to send again. A request that was sent
//! on already is never sent on again, so two replicas that each think the
//! other holds the lock serve it rather than pass it back and forth.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::error::{ApiError, ProblemCode};
use crate::http::{BODY_READ_TIMEOUT, REQUEST_TIMEOUT, wire};
use crate::store::SharedStore;

/// Set on a request sent on, to the sender's store binding (`GET /v1/info`):
/// the holder serves it, whoever it thinks holds, if it serves the same
/// database; a replica of another one refuses it (421), and the sender
/// serves it itself.
pub const FORWARDED: &str = "settled-forwarded";

/// How long a holder that could not be reached is left alone.
const UNREACHABLE_FOR: Duration = Duration::from_secs(1);

/// How often a request waiting for the holder's answer checks that the
/// holder is still the one (it is looked for once a second).
const LOOK_AGAIN: Duration = Duration::from_millis(250);

/// Longest wait for a connection to the holder, on the replicas' network.
const CONNECT_WAIT: Duration = Duration::from_millis(250);

/// Headers of one connection (hop by hop), never passed on either way, nor
/// those a `Connection` header names.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers not passed on besides: the holder's host is its own,
/// the length is the body's, this replica compresses the answer as it
/// would its own, and this replica checked the origin already (the holder
/// would compare it with its own host).
const NOT_PASSED: [&str; 6] = [
    "host",
    "content-length",
    "accept-encoding",
    "origin",
    "referer",
    "sec-fetch-site",
];

/// `headers` without those of one connection, nor `more`.
fn passable(headers: &HeaderMap, more: &[&str]) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        let name_str = name.as_str();
        let dropped = HOP_BY_HOP.contains(&name_str)
            || more.contains(&name_str)
            || name_str.starts_with("sec-fetch-")
            || named.iter().any(|n| n == name_str);
        if !dropped {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// Marks an answer passed back from the holder, which counted the request
/// in its metrics.
#[derive(Clone, Copy)]
pub struct SentOn;

/// What the middleware needs: the store says who holds the upkeep.
#[derive(Clone)]
pub struct Forwarder {
    store: SharedStore,
    /// Turns true when the server shuts down: then nothing is sent on (a
    /// long poll there would outlast this replica's own, ended at once).
    shutdown: watch::Receiver<bool>,
    client: reqwest::Client,
    /// This database's store binding, hex: the mark of a request sent on.
    binding: String,
    /// A holder that could not be reached, and since when.
    unreachable: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Forwarder {
    pub fn new(store: SharedStore, shutdown: watch::Receiver<bool>) -> Self {
        // Straight to the holder: no proxy of the environment, no redirect.
        // Answered within this replica's own time limit, so that a late
        // answer is not left behind. Idle connections closed before the
        // holder's idle timeout would close them under a request.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(Duration::from_secs(30))
            .connect_timeout(CONNECT_WAIT)
            .timeout(REQUEST_TIMEOUT - Duration::from_secs(1))
            .build()
            .expect("an HTTP client with no TLS settings builds");
        Self {
            binding: store.settlement_store_binding().to_hex(),
            store,
            shutdown,
            client,
            unreachable: Arc::default(),
        }
    }

    /// Where `request` goes, if it is sent on: a worker's write (claims,
    /// outcomes, lease extensions and releases, which the holder merges),
    /// a `POST` with a body of a stated length within the limit (any other
    /// is served here, where it is refused as it would be there).
    fn holder_for(&self, request: &Request) -> Option<String> {
        let headers = request.headers();
        let length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        let body_known = match *request.method() {
            Method::POST => length.is_some_and(|n| n <= wire::MAX_BODY_BYTES),
            _ => length.unwrap_or(0) == 0 && !headers.contains_key(header::TRANSFER_ENCODING),
        };
        if !body_known
            || headers.contains_key(FORWARDED)
            || *self.shutdown.borrow()
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

/// Send workers' writes on to the holder; serve everything else here, and
/// what was sent on here from a replica of this database.
pub async fn forward(State(f): State<Forwarder>, request: Request, next: Next) -> Response {
    if let Some(mark) = request.headers().get(FORWARDED)
        && mark.as_bytes() != f.binding.as_bytes()
    {
        return ApiError::auth(
            StatusCode::MISDIRECTED_REQUEST,
            ProblemCode::MisdirectedRequest,
            "sent on by a replica of another database: this one serves another",
        )
        .into_response();
    }
    let Some(holder) = f.holder_for(&request) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, wire::MAX_BODY_BYTES),
    );
    let Ok(Ok(bytes)) = read.await else {
        return ApiError::malformed("the request body could not be read in time").into_response();
    };
    let target = format!(
        "{holder}{}",
        parts.uri.path_and_query().map_or("", |p| p.as_str())
    );
    let headers = passable(&parts.headers, &NOT_PASSED);
    let send = f
        .client
        .request(parts.method.clone(), &target)
        .headers(headers)
        .header(FORWARDED, &f.binding)
        .body(bytes.clone())
        .send();
    let sent = tokio::select! {
        sent = send => sent,
        () = passed_over(&f, &holder) => return stalled(),
    };
    match sent {
        // The advertised URL leads to a replica of another database, which
        // did nothing with it: serve it here.
        Ok(answer) if answer.status() == StatusCode::MISDIRECTED_REQUEST => {
            tracing::warn!(holder = %holder, "the replica at the advertised URL serves another database; serving here");
            f.could_not_reach(holder);
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(answer) => tokio::select! {
            answer = passed_back(answer) => answer,
            () = passed_over(&f, &holder) => stalled(),
        },
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

/// Resolves once the store no longer names `holder` as the replica doing
/// the upkeep: its beat went stale (a stalled process keeps its lock),
/// another replica took over, or this one lost sight of the lock (its own
/// look failed, or it follows a new primary). A request sent on to it before then would
/// otherwise wait out the whole time limit for an answer that may never
/// come; one it is still answering (a long poll) goes on.
async fn passed_over(f: &Forwarder, holder: &str) {
    loop {
        tokio::time::sleep(LOOK_AGAIN).await;
        if f.store.forward_to().as_deref() != Some(holder) {
            return;
        }
    }
}

/// A request sent on to a holder that was passed over since: whether it
/// did anything with it is not known, and sending it again is safe.
fn stalled() -> Response {
    ApiError::unavailable("the replica doing the upkeep stopped answering").into_response()
}

/// The holder's answer, as it gave it (but for the connection's headers).
async fn passed_back(answer: reqwest::Response) -> Response {
    let status = answer.status();
    let headers = passable(answer.headers(), &["content-length"]);
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
