//! The service as the failover tests see it: HTTP answers with their
//! `Retry-After` and timing, the receipts' lasting state, and polls that
//! wait for a replica to say or do something, each within a deadline.

use super::*;

/// An answer: status, content type, `Retry-After`, raw body and its JSON,
/// and how long it took.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) content_type: String,
    pub(super) retry_after: Option<String>,
    pub(super) text: String,
    pub(super) body: Value,
    pub(super) took: Duration,
}

/// One replica's HTTP API.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) name: String,
    client: reqwest::Client,
    base: String,
}

/// A `finalized_at` for every receipt the tests enqueue.
const FINALIZED_AT: u64 = 1_764_460_800;
/// A single request must be answered within this, during a fault too.
const REQUEST_BOUND: Duration = Duration::from_secs(30);

impl Api {
    pub(super) fn new(name: &str, server: &Server) -> Self {
        Self {
            name: name.to_owned(),
            client: reqwest::Client::new(),
            base: server.base.clone(),
        }
    }

    /// Send a request; it must be answered within `bound`.
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        bound: Duration,
    ) -> Answer {
        let started = Instant::now();
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .timeout(bound);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap_or_else(|e| {
            panic!(
                "{} {path}: no answer after {:?}: {e}",
                self.name,
                started.elapsed()
            )
        });
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let retry_after = header("retry-after");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        Answer {
            status,
            content_type,
            retry_after,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
            took: started.elapsed(),
        }
    }

    pub(super) async fn get(&self, path: &str) -> Answer {
        self.call(reqwest::Method::GET, path, None, REQUEST_BOUND)
            .await
    }

    pub(super) async fn post(&self, path: &str, body: &Value) -> Answer {
        self.call(reqwest::Method::POST, path, Some(body), REQUEST_BOUND)
            .await
    }

    /// The body of an answer that must have `status`.
    #[track_caller]
    pub(super) fn ok(&self, answer: &Answer, status: u16, what: &str) -> Value {
        assert_eq!(
            answer.status, status,
            "{} {what}: {}",
            self.name, answer.text
        );
        answer.body.clone()
    }

    /// A receipt body; not visible before `visible_at_ms` if given.
    pub(super) fn receipt(id: &str, visible_at_ms: Option<u64>) -> Value {
        let mut receipt = json!({"receipt_id": id, "finalized_at": FINALIZED_AT,
            "observation": {"amount_cents": 1250}});
        if let Some(at) = visible_at_ms {
            receipt["visible_at_ms"] = json!(at);
        }
        receipt
    }

    pub(super) async fn enqueue(&self, id: &str, visible_at_ms: Option<u64>) {
        let answer = self
            .post("/v1/receipts", &Self::receipt(id, visible_at_ms))
            .await;
        self.ok(&answer, 201, id);
    }

    /// Claim `id` for `lease_ms`; the claim to commit with.
    pub(super) async fn claim(&self, id: &str, lease_ms: u64) -> Value {
        let answer = self
            .post(
                &format!("/v1/receipts/{id}/claim"),
                &json!({"worker_id": "failover-worker", "lease_ms": lease_ms}),
            )
            .await;
        self.ok(&answer, 200, id)
    }

    pub(super) async fn commit(&self, claim: &Value, transcript_id: &str) -> Answer {
        let id = claim["receipt_id"].as_str().expect("receipt_id");
        let outcome = json!({"kind": "accepted", "transcript_id": transcript_id});
        self.post(
            &format!("/v1/receipts/{id}/outcome"),
            &json!({"claim": claim, "outcome": outcome}),
        )
        .await
    }

    /// Claim `id` and commit it accepted.
    pub(super) async fn settle(&self, id: &str) {
        let claim = self.claim(id, 30_000).await;
        let answer = self.commit(&claim, &format!("tx-{id}")).await;
        self.ok(&answer, 200, id);
    }

    pub(super) async fn info(&self) -> Value {
        let answer = self.get("/v1/info").await;
        self.ok(&answer, 200, "/v1/info")
    }

    /// The parts of each receipt's state that a failover must not change.
    pub(super) async fn snapshot(&self, ids: &[&str]) -> Vec<Value> {
        let mut states = Vec::new();
        for id in ids {
            let answer = self.get(&format!("/v1/receipts/{id}")).await;
            let view = self.ok(&answer, 200, id);
            states.push(json!({"receipt_id": id, "state": view["state"],
                "attempts": view["attempts"], "row_version": view["row_version"],
                "lease": view["lease"], "transcript_id": view["transcript_id"],
                "next_visible_at_ms": view["next_visible_at_ms"], "history": view["history"]}));
        }
        states
    }

    /// A metric's value in `/metrics` (the first sample of that name).
    pub(super) async fn metric(&self, name: &str) -> Option<f64> {
        let answer = self.get("/metrics").await;
        assert_eq!(
            answer.status, 200,
            "{}: /metrics must answer 200 (to show {name}); it answered {} after {:?}: {}",
            self.name, answer.status, answer.took, answer.text
        );
        answer
            .text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .find(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with([' ', '{']))
            })
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
    }

    /// Poll `/readyz` every 100 ms until it answers `status`; how long it
    /// took since `since`, and that answer.
    pub(super) async fn until_ready_is(
        &self,
        status: u16,
        since: Instant,
        bound: Duration,
    ) -> (Duration, Answer) {
        loop {
            let left = bound.saturating_sub(since.elapsed());
            let answer = self
                .call(reqwest::Method::GET, "/readyz", None, left + REQUEST_SLACK)
                .await;
            if answer.status == status {
                return (since.elapsed(), answer);
            }
            assert!(
                since.elapsed() < bound,
                "{}: /readyz did not answer {status} within {bound:?}; it answers {} {}",
                self.name,
                answer.status,
                answer.text
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Enqueue `id` every 100 ms, each attempt answered 503
    /// `backend_unavailable` or committed, until one commits; how long it
    /// took since `since`. It must commit within `bound` of `since`.
    pub(super) async fn until_enqueued(
        &self,
        id: &str,
        visible_at_ms: Option<u64>,
        since: Instant,
        bound: Duration,
    ) -> Duration {
        let receipt = Self::receipt(id, visible_at_ms);
        let mut refused = 0;
        loop {
            let left = bound.saturating_sub(since.elapsed());
            let answer = self
                .call(
                    reqwest::Method::POST,
                    "/v1/receipts",
                    Some(&receipt),
                    left + REQUEST_SLACK,
                )
                .await;
            // 200: an attempt answered 503 had been stored after all (an
            // enqueue of the same receipt again is a no-op).
            if matches!(answer.status, 200 | 201) {
                return since.elapsed();
            }
            assert_unavailable(&self.name, "an enqueue", &answer);
            refused += 1;
            assert!(
                since.elapsed() < bound,
                "{}: no enqueue committed within {bound:?} ({refused} answered 503, the last \
                 in {:?}: {})",
                self.name,
                answer.took,
                answer.text
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How much longer than its deadline a poll waits for one answer before it
/// calls the request hung.
const REQUEST_SLACK: Duration = Duration::from_secs(5);

/// A 503 a client can act on: problem+json, code `backend_unavailable`,
/// and when to try again.
#[track_caller]
pub(super) fn assert_unavailable(replica: &str, what: &str, answer: &Answer) {
    assert_eq!(
        answer.status, 503,
        "{replica}: {what} while no host takes writes: {}",
        answer.text
    );
    assert_eq!(
        answer.content_type, "application/problem+json",
        "{replica}: {what}"
    );
    assert_eq!(
        answer.body["code"], "backend_unavailable",
        "{replica}: {what}: {}",
        answer.text
    );
    let retry_after = answer.retry_after.as_deref().unwrap_or_else(|| {
        panic!(
            "{replica}: {what} answered 503 without Retry-After: {}",
            answer.text
        )
    });
    assert!(
        retry_after.parse::<u64>().is_ok(),
        "{replica}: {what}: Retry-After {retry_after:?} is not a number of seconds"
    );
}
