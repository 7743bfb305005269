//! The service as the outage tests see it: a started binary, its HTTP
//! answers with their timing, and what a 503 during a cut must look like.

use super::*;

/// The binary with `args`, waited for without blocking the runtime (which
/// serves the proxy it may reach its database through).
pub(super) async fn start_settled(dir: &std::path::Path, args: &[&str]) -> Server {
    Launch::new(dir).args(args).spawn().ready_async().await
}

/// An answer: status, content type, raw body and its JSON, and how long it took.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) content_type: String,
    pub(super) text: String,
    pub(super) body: Value,
    pub(super) took: Duration,
}

pub(super) struct Api {
    pub(super) client: reqwest::Client,
    pub(super) base: String,
}

impl Api {
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Answer {
        let started = Instant::now();
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.expect("body");
        Answer {
            status,
            content_type,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
            took: started.elapsed(),
        }
    }

    pub(super) async fn get(&self, path: &str) -> Answer {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub(super) async fn post(&self, path: &str, body: &Value) -> Answer {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    #[track_caller]
    pub(super) fn ok(answer: &Answer, status: u16, what: &str) -> Value {
        assert_eq!(answer.status, status, "{what}: {}", answer.text);
        answer.body.clone()
    }

    pub(super) async fn enqueue(&self, id: &str, visible_at_ms: Option<u64>) {
        let mut receipt = json!({"receipt_id": id, "finalized_at": 1_764_460_800,
            "observation": {"amount_cents": 1250}});
        if let Some(at) = visible_at_ms {
            receipt["visible_at_ms"] = json!(at);
        }
        let answer = self.post("/v1/receipts", &receipt).await;
        Self::ok(&answer, 201, id);
    }

    pub(super) async fn claim(&self, id: &str, lease_ms: u64) -> Value {
        let answer = self
            .post(
                &format!("/v1/receipts/{id}/claim"),
                &json!({"worker_id": "outage-worker", "lease_ms": lease_ms}),
            )
            .await;
        Self::ok(&answer, 200, id)
    }

    pub(super) async fn commit(&self, claim: &Value, outcome: Value) -> Answer {
        let id = claim["receipt_id"].as_str().expect("receipt_id");
        self.post(
            &format!("/v1/receipts/{id}/outcome"),
            &json!({"claim": claim, "outcome": outcome}),
        )
        .await
    }

    pub(super) async fn settle(&self, id: &str, outcome: Value) -> Value {
        let claim = self.claim(id, 30_000).await;
        let answer = self.commit(&claim, outcome).await;
        Self::ok(&answer, 200, id)
    }

    /// The parts of a receipt's state that must survive an outage.
    pub(super) async fn snapshot(&self, ids: &[&str]) -> BTreeMap<String, Value> {
        let mut states = BTreeMap::new();
        for id in ids {
            let view = Self::ok(&self.get(&format!("/v1/receipts/{id}")).await, 200, id);
            states.insert(
                (*id).to_owned(),
                json!({"state": view["state"], "attempts": view["attempts"],
                    "row_version": view["row_version"], "lease": view["lease"],
                    "transcript_id": view["transcript_id"], "last_failure": view["last_failure"],
                    "next_visible_at_ms": view["next_visible_at_ms"], "history": view["history"]}),
            );
        }
        states
    }

    /// Poll `/readyz` until it answers `status`; how long it took.
    pub(super) async fn until_ready_is(&self, status: u16, bound: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if self.get("/readyz").await.status == status {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < bound,
                "/readyz did not answer {status} within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub(super) fn accepted(tx: &str) -> Value {
    json!({"kind": "accepted", "transcript_id": tx})
}

/// Check a 503 answered during the cut: quick, problem+json, class `backend`,
/// and nothing of the database in it.
#[track_caller]
pub(super) fn assert_unavailable(what: &str, answer: &Answer, secrets: &[String]) {
    assert_eq!(
        answer.status, 503,
        "{what} during the outage: {}",
        answer.text
    );
    assert_eq!(answer.content_type, "application/problem+json", "{what}");
    assert_eq!(answer.body["class"], "backend", "{what}: {}", answer.text);
    assert_eq!(
        answer.body["code"], "backend_unavailable",
        "{what}: {}",
        answer.text
    );
    assert_eq!(answer.body["status"], 503, "{what}");
    let lower = answer.text.to_lowercase();
    for secret in secrets {
        assert!(
            !lower.contains(&secret.to_lowercase()),
            "{what} leaks {secret:?}: {}",
            answer.text
        );
    }
    assert!(
        answer.took < ANSWER_BOUND,
        "{what} took {:?} during the outage",
        answer.took
    );
}
