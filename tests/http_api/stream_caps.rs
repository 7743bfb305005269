//! The caps on event streams (`--max-streams`, `--max-streams-per-caller`):
//! readers holding streams cannot lock out anyone else. Past a cap a
//! stream is refused at once with 429, and health checks, enqueues, claims
//! and outcomes are answered quickly while the capped streams stay open.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use settled::clock::ManualClock;
use settled::domain::RetryPolicy;
use settled::http::middleware::auth::Tokens;
use settled::http::{AppState, StreamLimits};
use settled::server::Limits;
use tokio::sync::watch;

use crate::common::Fresh;
use crate::common::http::T0;

const READERS: [&str; 3] = [
    "reader-one-0123456789",
    "reader-two-0123456789",
    "reader-three-0123456789",
];
const PRODUCER: &str = "producer-0123456789";
const WORKER: &str = "worker-0123456789";
/// The stream cap N, and the connection cap M > N + 10.
const STREAM_CAP: usize = 8;
const CONNECTION_CAP: usize = 40;
/// What "answered at once" means here, on a loaded machine too.
const PROMPT: Duration = Duration::from_secs(1);

struct Capped {
    base: String,
    client: reqwest::Client,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _fresh: Fresh,
}

async fn capped(fresh: Fresh, per_caller: usize) -> Capped {
    let mut entries = vec![format!("producer:{PRODUCER}"), format!("worker:{WORKER}")];
    entries.extend(READERS.iter().map(|t| format!("reader:{t}")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        RetryPolicy::default(),
        Arc::new(ManualClock::new(T0)),
        rx.clone(),
    )
    .with_tokens(Tokens::parse(&entries).unwrap())
    .with_stream_limits(StreamLimits {
        total: STREAM_CAP,
        per_caller,
    });
    let limits = Limits {
        max_connections: CONNECTION_CAP,
        grace: Duration::from_secs(2),
        ..Limits::default()
    };
    let mut stopped = rx;
    let task = tokio::spawn(settled::server::serve_with(
        listener,
        state,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
        limits,
    ));
    Capped {
        base,
        client: reqwest::Client::new(),
        stop,
        task,
        _fresh: fresh,
    }
}

impl Capped {
    /// Ask for a stream as `token`: the open stream, or the refusal's
    /// status, `Retry-After`, body and how long it took.
    async fn open(
        &self,
        token: &str,
    ) -> Result<reqwest::Response, (u16, Option<String>, Value, Duration)> {
        let started = Instant::now();
        let response = self
            .client
            .get(format!("{}/v1/history", self.base))
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("an answer");
        if response.status().as_u16() == 200 {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.json().await.expect("problem+json");
        Err((status, retry_after, body, started.elapsed()))
    }

    async fn call(
        &self,
        token: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let started = Instant::now();
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = tokio::time::timeout(PROMPT, request.send())
            .await
            .unwrap_or_else(|_| panic!("{path} was not answered within {PROMPT:?}"))
            .expect("an answer");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        assert!(
            started.elapsed() < PROMPT,
            "{path} took {:?}",
            started.elapsed()
        );
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `/healthz`, an enqueue, a claim and its outcome, each answered within [`PROMPT`].
    async fn everyone_else_is_served(&self, id: &str) {
        let (status, body) = self
            .call(None, reqwest::Method::GET, "/healthz", None)
            .await;
        assert_eq!(status, 200, "{body}");
        let receipt = json!({"receipt_id": id, "finalized_at": 100});
        let (status, body) = self
            .call(
                Some(PRODUCER),
                reqwest::Method::POST,
                "/v1/receipts",
                Some(receipt),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let claim = json!({"worker_id": "w", "lease_ms": 30_000});
        let (status, body) = self
            .call(
                Some(WORKER),
                reqwest::Method::POST,
                &format!("/v1/receipts/{id}/claim"),
                Some(claim),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let outcome = json!({"claim": body, "outcome": {"kind": "accepted", "transcript_id": "t"}});
        let (status, body) = self
            .call(
                Some(WORKER),
                reqwest::Method::POST,
                &format!("/v1/receipts/{id}/outcome"),
                Some(outcome),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self
            .call(None, reqwest::Method::GET, "/metrics", None)
            .await;
        let text = text.as_str().expect("text").to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().unwrap();
    }
}

#[track_caller]
fn assert_refused(refused: &(u16, Option<String>, Value, Duration), why: &str) {
    let (status, retry_after, body, took) = refused;
    assert_eq!(*status, 429, "{body}");
    assert_eq!(body["code"], "too_many_streams", "{body}");
    assert_eq!(body["class"], "capacity", "{body}");
    assert!(body["detail"].as_str().unwrap().contains(why), "{body}");
    let seconds: u64 = retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(seconds >= 1, "Retry-After {seconds}");
    assert!(*took < PROMPT, "refused after {took:?}, not at once");
}

/// N + 10 streams asked for by one reader token: N are opened, the ten past
/// the cap are refused at once, and everyone else is still served.
async fn one_reader_cannot_take_more_than_the_stream_cap(fresh: Fresh) {
    let s = capped(fresh, STREAM_CAP).await;
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..STREAM_CAP + 10 {
        match s.open(READERS[0]).await {
            Ok(stream) => open.push(stream),
            Err(r) => refused.push(r),
        }
    }
    assert_eq!(open.len(), STREAM_CAP);
    assert_eq!(refused.len(), 10);
    for r in &refused {
        assert_refused(r, "--max-streams");
    }
    s.everyone_else_is_served("while-capped").await;
    // JSON pages are still read while streams are capped.
    let (status, body) = s
        .call(
            Some(READERS[0]),
            reqwest::Method::GET,
            "/v1/history?limit=5",
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.metric("settled_history_streams").await, STREAM_CAP as f64);
    assert_eq!(
        s.metric("settled_history_streams_refused_total").await,
        10.0
    );
    // A stream closed frees its place.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let reopened = loop {
        match s.open(READERS[1]).await {
            Ok(stream) => break stream,
            Err(r) if Instant::now() < deadline => {
                assert_eq!(r.0, 429);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(r) => panic!("no place freed by a closed stream: {r:?}"),
        }
    };
    drop((open, reopened));
    s.stop().await;
}

/// N streams from several tokens, each within its own cap: the next one,
/// from any token, is refused, and everyone else is still served; a token
/// at its own cap is refused while the server has room.
async fn several_readers_share_the_stream_cap(fresh: Fresh) {
    let per_caller = 3;
    let s = capped(fresh, per_caller).await;
    let mut open = Vec::new();
    for _ in 0..per_caller {
        open.push(s.open(READERS[0]).await.expect("within the caps"));
        open.push(s.open(READERS[1]).await.expect("within the caps"));
    }
    assert_refused(
        &s.open(READERS[0]).await.expect_err("past its cap"),
        "--max-streams-per-caller",
    );
    while open.len() < STREAM_CAP {
        open.push(s.open(READERS[2]).await.expect("within the caps"));
    }
    for token in READERS {
        assert_refused(
            &s.open(token).await.expect_err("past the cap"),
            "--max-streams",
        );
    }
    s.everyone_else_is_served("shared-cap").await;
    drop(open);
    s.stop().await;
}

crate::on_every_backend!(
    one_reader_cannot_take_more_than_the_stream_cap,
    several_readers_share_the_stream_cap,
);
