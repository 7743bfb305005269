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

/// A store whose database is gone, with internals in its error text.
struct BrokenStore;

const SECRET: &str = "SELECT lease_token FROM receipts -- /var/lib/settled/settled.db";

fn down<T>() -> StoreResult<T> {
    Err(StoreError::backend(SECRET))
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
        down()
    }
    async fn enqueue(&self, _: &[NewReceipt], _: UnixMs) -> StoreResult<Vec<Enqueued>> {
        down()
    }
    async fn claim_receipt(
        &self,
        _: &ReceiptId,
        _: &WorkerId,
        _: UnixMs,
        _: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        down()
    }
    async fn claim_from(
        &self,
        _: &WorkerId,
        _: UnixMs,
        _: LeaseMs,
        _: ClaimLimit,
        _: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        down()
    }
    async fn groups(&self, _: UnixMs, _: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        down()
    }
    async fn set_group(&self, _: &GroupName, _: &GroupLimits, _: UnixMs) -> StoreResult<()> {
        down()
    }
    async fn record_claimed_outcomes(
        &self,
        _: &[(Claim, Outcome)],
        _: RetryPolicy,
        _: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        down()
    }
    async fn extend_lease(&self, _: &Claim, _: LeaseMs, _: UnixMs) -> StoreResult<Claimed> {
        down()
    }
    async fn release_lease(&self, _: &Claim, _: UnixMs) -> StoreResult<()> {
        down()
    }
    async fn receipt(&self, _: &ReceiptId, _: UnixMs) -> StoreResult<Option<ReceiptView>> {
        down()
    }
    async fn dead_letters(
        &self,
        _: usize,
        _: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        down()
    }
    async fn dead_letter(&self, _: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        down()
    }
    async fn act(
        &self,
        _: &OperatorAction,
        _: &[ReceiptId],
        _: Option<&str>,
        _: UnixMs,
        _: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        down()
    }
    async fn status(&self, _: UnixMs, _: usize) -> StoreResult<StatusView> {
        down()
    }
    async fn purge_finished(&self, _: UnixMs, _: usize) -> StoreResult<u64> {
        down()
    }
    async fn history_feed(&self, _: FeedStart, _: usize) -> StoreResult<FeedRead> {
        down()
    }
    async fn add_stats(&self, _: &[StatsMinute], _: UnixMs) -> StoreResult<()> {
        down()
    }
    async fn stats(&self, _: UnixMs, _: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        down()
    }
    async fn find_receipts(
        &self,
        _: &ReceiptFilter,
        _: &SearchPage,
        _: UnixMs,
    ) -> StoreResult<SearchResults> {
        down()
    }
}

#[tokio::test]
async fn a_failing_database_answers_503_backend_without_internals() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        Arc::new(BrokenStore),
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
        assert_eq!(response.status().as_u16(), 503, "{method} {path}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let text = response.text().await.unwrap();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["class"], "backend", "{method} {path}");
        assert_eq!(body["code"], "backend_unavailable");
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
