use std::sync::Arc;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::json;
use settled::clock::ManualClock;
use settled::domain::*;
use settled::http::AppState;
use settled::store::*;
use tokio::sync::Notify;

use crate::common::Fresh;
use crate::common::http::spawn;

async fn unknown_paths_and_methods_are_problems(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.get("/v2/receipts")
        .await
        .assert_problem(404, "not_found", "not_found");
    s.call(Method::PUT, "/v1/receipts", Some(json!({})))
        .await
        .assert_problem(405, "method_not_allowed", "validation");
    s.call(Method::GET, "/v1/claims", None)
        .await
        .assert_problem(405, "method_not_allowed", "validation");
    s.stop().await;
}

async fn oversized_bodies_get_413_and_change_nothing(fresh: Fresh) {
    let s = spawn(fresh).await;
    let big = format!(
        r#"{{"receipt_id":"big","finalized_at":1,"observation":{{"x":"{}"}}}}"#,
        "a".repeat(1024 * 1024)
    );
    let answer = s
        .raw(
            Method::POST,
            "/v1/receipts",
            Some("application/json"),
            big.into_bytes(),
        )
        .await;
    answer.assert_problem(413, "body_too_large", "validation");
    s.get("/v1/receipts/big")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    let items: Vec<_> = (0..1024).map(|i| json!({"receipt_id": format!("r{i}"), "finalized_at": 1, "observation": {"pad": "p".repeat(1100)}})).collect();
    let answer = s
        .post("/v1/receipts/batch", json!({"receipts": items}))
        .await;
    answer.assert_problem(413, "body_too_large", "validation");
    assert_eq!(s.get("/v1/status").await.body["counts"]["pending"], 0);
    s.stop().await;
}

crate::on_every_backend!(
    unknown_paths_and_methods_are_problems,
    oversized_bodies_get_413_and_change_nothing
);

/// A store that fails every call the same way, with internals in its error text.
struct BrokenStore(Fault);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The database is gone.
    Down,
    /// The code on the request path panics.
    Panics,
    /// An invariant of settled's own fails.
    Invariant,
    /// The database never answers.
    Hangs,
}

const SECRET: &str = "SELECT lease_token FROM receipts -- /var/lib/settled/settled.db";

impl BrokenStore {
    async fn fail<T>(&self) -> StoreResult<T> {
        match self.0 {
            Fault::Down => Err(StoreError::backend(SECRET)),
            Fault::Panics => panic!("{SECRET}"),
            Fault::Invariant => Err(StoreError::internal(SECRET)),
            Fault::Hangs => std::future::pending().await,
        }
    }
}

#[async_trait]
impl SettlementOutcomeStore for BrokenStore {
    fn settlement_store_binding(&self) -> SettlementStoreBinding {
        SettlementStoreBinding::from_digest([0; 32])
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Sqlite
    }
    fn work_notifier(&self) -> Arc<Notify> {
        Arc::new(Notify::new())
    }
    async fn ping(&self) -> StoreResult<()> {
        self.fail().await
    }
    async fn enqueue(&self, _: &[NewReceipt], _: UnixMs) -> StoreResult<Vec<Enqueued>> {
        self.fail().await
    }
    async fn claim_receipt(
        &self,
        _: &ReceiptId,
        _: &WorkerId,
        _: UnixMs,
        _: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        self.fail().await
    }
    async fn claim_from(
        &self,
        _: &WorkerId,
        _: UnixMs,
        _: LeaseMs,
        _: ClaimLimit,
        _: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        self.fail().await
    }
    async fn groups(&self, _: UnixMs, _: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        self.fail().await
    }
    async fn set_group(&self, _: &GroupName, _: &GroupLimits, _: UnixMs) -> StoreResult<()> {
        self.fail().await
    }
    async fn record_claimed_outcomes(
        &self,
        _: &[(Claim, Outcome)],
        _: RetryPolicy,
        _: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        self.fail().await
    }
    async fn extend_lease(&self, _: &Claim, _: LeaseMs, _: UnixMs) -> StoreResult<Claimed> {
        self.fail().await
    }
    async fn release_lease(&self, _: &Claim, _: UnixMs) -> StoreResult<()> {
        self.fail().await
    }
    async fn receipt(&self, _: &ReceiptId, _: UnixMs) -> StoreResult<Option<ReceiptView>> {
        self.fail().await
    }
    async fn dead_letters(
        &self,
        _: usize,
        _: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        self.fail().await
    }
    async fn dead_letter(&self, _: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        self.fail().await
    }
    async fn act(
        &self,
        _: &OperatorAction,
        _: &[ReceiptId],
        _: Option<&str>,
        _: UnixMs,
        _: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        self.fail().await
    }
    async fn status(&self, _: UnixMs, _: usize) -> StoreResult<StatusView> {
        self.fail().await
    }
    async fn forget_idle_groups(&self, _: &str, _: usize) -> StoreResult<SweptGroups> {
        self.fail().await
    }
    async fn purge_finished(&self, _: UnixMs, _: usize) -> StoreResult<u64> {
        self.fail().await
    }
    async fn history_feed(&self, _: FeedStart, _: usize) -> StoreResult<FeedRead> {
        self.fail().await
    }
    async fn add_stats(&self, _: &[StatsMinute], _: UnixMs) -> StoreResult<()> {
        self.fail().await
    }
    async fn stats(&self, _: UnixMs, _: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        self.fail().await
    }
    async fn find_receipts(
        &self,
        _: &ReceiptFilter,
        _: &SearchPage,
        _: UnixMs,
    ) -> StoreResult<SearchResults> {
        self.fail().await
    }
}

/// Every request of `calls` against a store failing with `fault` answers
/// `status` with `code` and `class`, showing none of the store's internals.
async fn every_call_answers(fault: Fault, status: u16, code: &str, class: &str) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        Arc::new(BrokenStore(fault)),
        RetryPolicy::default(),
        Arc::new(ManualClock::new(1)),
        rx,
    );
    tokio::spawn(settled::server::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let client = reqwest::Client::new();
    let claim = json!({"receipt_id": "r", "finalized_at": 1, "attempts": 0, "row_version": 1,
        "lease_owner": "w", "lease_token": "t", "lease_until_ms": 5});
    let calls = [
        (Method::GET, "/readyz", None),
        (
            Method::POST,
            "/v1/receipts",
            Some(json!({"receipt_id": "r", "finalized_at": 1})),
        ),
        (
            Method::POST,
            "/v1/receipts/batch",
            Some(json!({"receipts": [{"receipt_id": "r", "finalized_at": 1}]})),
        ),
        (Method::GET, "/v1/receipts/r", None),
        (
            Method::POST,
            "/v1/claims",
            Some(json!({"worker_id": "w", "lease_ms": 5, "limit": 1})),
        ),
        (
            Method::POST,
            "/v1/receipts/r/claim",
            Some(json!({"worker_id": "w", "lease_ms": 5})),
        ),
        (
            Method::POST,
            "/v1/receipts/r/outcome",
            Some(json!({"claim": claim, "outcome": {"kind": "skipped", "reason": "denied"}})),
        ),
        (
            Method::POST,
            "/v1/outcomes",
            Some(
                json!({"outcomes": [{"claim": claim, "outcome": {"kind": "skipped", "reason": "denied"}}]}),
            ),
        ),
        (
            Method::POST,
            "/v1/receipts/r/lease",
            Some(json!({"claim": claim, "extend_ms": 5})),
        ),
        (
            Method::DELETE,
            "/v1/receipts/r/lease",
            Some(json!({"claim": claim})),
        ),
        (Method::GET, "/v1/dead-letters", None),
        (Method::GET, "/v1/dead-letters/r", None),
        (Method::POST, "/v1/dead-letters/r/redrive", None),
        (Method::GET, "/v1/status", None),
        (Method::GET, "/v1/stats", None),
        (Method::GET, "/metrics", None),
    ];
    for (method, path, body) in calls {
        let mut request = client.request(method.clone(), format!("{base}{path}"));
        if let Some(body) = body {
            request = request.json(&body);
        } else if method != Method::GET {
            request = request.header("content-type", "application/json");
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.status().as_u16(),
            status,
            "{fault:?}: {method} {path}"
        );
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        // Only an outage says when to come back: a bug does not pass by waiting.
        assert_eq!(
            response.headers().contains_key("retry-after"),
            status == 503,
            "{fault:?}: {method} {path}"
        );
        let text = response.text().await.unwrap();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["class"], class, "{fault:?}: {method} {path}");
        assert_eq!(body["code"], code, "{fault:?}: {method} {path}");
        for leak in ["SELECT", "/var/lib", "lease_token FROM"] {
            assert!(
                !text.contains(leak),
                "{method} {path} leaked {leak}: {text}"
            );
        }
    }
    // What needs no database still works.
    assert_eq!(
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/v1/info"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[tokio::test]
async fn a_failing_database_answers_503_backend_without_internals() {
    every_call_answers(Fault::Down, 503, "backend_unavailable", "backend").await;
}

#[tokio::test]
async fn a_panic_answers_500_internal_error_without_internals() {
    every_call_answers(Fault::Panics, 500, "internal_error", "internal").await;
}

#[tokio::test]
async fn a_broken_invariant_answers_500_internal_error_without_internals() {
    every_call_answers(Fault::Invariant, 500, "internal_error", "internal").await;
}

/// A request the database never answers ends at the server's time limit
/// (30 s, on a paused clock here) with a code of its own, not as an outage.
#[tokio::test(start_paused = true)]
async fn a_request_past_the_time_limit_answers_504_time_limit_exceeded() {
    use tower::ServiceExt;
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        Arc::new(BrokenStore(Fault::Hangs)),
        RetryPolicy::default(),
        Arc::new(ManualClock::new(1)),
        rx,
    );
    let request = axum::http::Request::post("/v1/receipts")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            r#"{"receipt_id": "r", "finalized_at": 1}"#,
        ))
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = settled::http::app(state).oneshot(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 504);
    assert!(started.elapsed() >= std::time::Duration::from_secs(30));
    assert_eq!(response.headers()["retry-after"], "1");
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], "time_limit_exceeded");
    assert_eq!(body["class"], "backend");
}
