//! A real server on 127.0.0.1:0 over a fresh store, with a clock the test moves.

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use settled::clock::ManualClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::http::middleware::auth::Tokens;
use tokio::sync::watch;

use super::Fresh;

/// Where the test clock starts: 2025-12-01, in ms.
pub const T0: u64 = 1_764_547_200_000;

/// A running server.
pub struct TestServer {
    pub base: String,
    pub clock: ManualClock,
    pub client: reqwest::Client,
    pub fresh: Fresh,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// An answer: status, content type and JSON body (Null when empty).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Value,
}

impl Answer {
    /// Assert a problem+json error with this status, code and class.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str, class: &str) {
        assert_eq!(self.status.as_u16(), status, "status of {:?}", self.body);
        assert_eq!(
            self.content_type, "application/problem+json",
            "{:?}",
            self.body
        );
        assert_eq!(self.body["code"], code, "code of {:?}", self.body);
        assert_eq!(self.body["class"], class, "class of {:?}", self.body);
        assert_eq!(self.body["status"], status);
        assert_eq!(self.body["type"], "about:blank");
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
    }

    /// Assert a 2xx status and return the body.
    #[track_caller]
    pub fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "{:?}", self.body);
        &self.body
    }
}

/// Start a server with the default policy.
pub async fn spawn(fresh: Fresh) -> TestServer {
    spawn_with(fresh, RetryPolicy::default()).await
}

/// Start a server with `policy`.
pub async fn spawn_with(fresh: Fresh, policy: RetryPolicy) -> TestServer {
    spawn_full(fresh, policy, Tokens::default()).await
}

/// Start a server that requires these tokens.
pub async fn spawn_with_tokens(fresh: Fresh, tokens: Tokens) -> TestServer {
    spawn_full(fresh, RetryPolicy::default(), tokens).await
}

/// Start a server that exports its spans to `endpoint` (an OTLP/HTTP
/// traces URL) through a queue of `queue` spans.
pub async fn spawn_traced(fresh: Fresh, endpoint: &str, queue: usize) -> TestServer {
    spawn_configured(fresh, RetryPolicy::default(), |state| {
        let (dropped, exported) = state.trace_counters();
        let to = settled::telemetry::ExportTo {
            endpoint: Some(endpoint.to_owned()),
            queue,
        };
        let telemetry =
            settled::telemetry::Telemetry::start(&to, dropped, exported).expect("exporter");
        state.with_telemetry(telemetry)
    })
    .await
}

async fn spawn_full(fresh: Fresh, policy: RetryPolicy, tokens: Tokens) -> TestServer {
    spawn_configured(fresh, policy, |state| state.with_tokens(tokens)).await
}

async fn spawn_configured(
    fresh: Fresh,
    policy: RetryPolicy,
    configure: impl FnOnce(AppState) -> AppState,
) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let clock = ManualClock::new(T0);
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        policy,
        Arc::new(clock.clone()),
        rx.clone(),
    );
    let state = configure(state);
    let mut stopped = rx;
    let task = tokio::spawn(settled::server::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    TestServer {
        base,
        clock,
        client: reqwest::Client::new(),
        fresh,
        stop,
        task,
    }
}

impl TestServer {
    /// Send a request with an optional JSON body.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        Self::answer(request.send().await.expect("request")).await
    }

    /// Send raw bytes with a content type.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Answer {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        Self::answer(request.send().await.expect("request")).await
    }

    async fn answer(response: reqwest::Response) -> Answer {
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = response.bytes().await.expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Answer {
            status,
            content_type,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, None).await
    }

    /// GET a text body, expecting 200.
    pub async fn get_text(&self, path: &str) -> String {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 200);
        response.text().await.expect("body")
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.call(Method::POST, path, Some(body)).await
    }

    /// Enqueue `id` with `finalized_at` 100 and no observation; expects 201.
    pub async fn enqueue(&self, id: &str) -> Value {
        self.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 100}),
        )
        .await
        .ok(201)
        .clone()
    }

    /// Claim up to `limit` receipts as `worker` with a 30 s lease.
    pub async fn claim(&self, worker: &str, limit: usize) -> Vec<Value> {
        let body = json!({"worker_id": worker, "lease_ms": 30_000, "limit": limit});
        let answer = self.post("/v1/claims", body).await;
        answer.ok(200)["claims"].as_array().expect("claims").clone()
    }

    /// Report `outcome` for `claim`.
    pub async fn outcome(&self, claim: &Value, outcome: Value) -> Answer {
        let id = claim["receipt_id"].as_str().expect("receipt_id");
        let path = format!("/v1/receipts/{}/outcome", urlencode(id));
        self.post(&path, json!({"claim": claim, "outcome": outcome}))
            .await
    }

    /// The receipt's state, expecting 200.
    pub async fn receipt(&self, id: &str) -> Value {
        self.get(&format!("/v1/receipts/{}", urlencode(id)))
            .await
            .ok(200)
            .clone()
    }

    /// Stop the server gracefully and wait for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("server task").expect("server");
    }
}

/// Percent-encode a path segment.
pub fn urlencode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
