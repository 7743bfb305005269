//! The server the examples run against, the receipts they are given and
//! the end state every receipt must reach.

use super::*;

/// A running `settled` on an ephemeral port with a fresh SQLite database
/// (fields drop in order: the process is killed before its directory goes).
pub(super) struct Server {
    pub(super) _process: process::Server,
    pub(super) base: String,
    pub(super) client: reqwest::Client,
    pub(super) dir: tempfile::TempDir,
}

impl Server {
    pub(super) fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = format!("sqlite:{}", dir.path().join("settled.db").display());
        let process = Launch::new(dir.path())
            .database(&db)
            // A quick retry policy, so retried receipts come back within the test.
            .args(&["--initial-backoff-ms", "20", "--backoff-cap-ms", "200"])
            .args(&["--token", &format!("worker:{WORKER_TOKEN}")])
            .args(&["--token", &format!("operator:{OPERATOR_TOKEN}")])
            .spawn()
            .ready();
        Self {
            base: process.base.clone(),
            _process: process,
            client: reqwest::Client::new(),
            dir,
        }
    }

    pub(super) async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).expect("json body")
        };
        (status, body)
    }

    pub(super) async fn get(&self, path: &str) -> Value {
        let (status, body) = self
            .send(self.client.get(format!("{}{path}", self.base)))
            .await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    pub(super) async fn post(&self, path: &str, body: Value) -> Value {
        let (status, out) = self
            .send(self.client.post(format!("{}{path}", self.base)).json(&body))
            .await;
        assert_eq!(status, 200, "POST {path}: {out}");
        out
    }

    pub(super) async fn counts(&self) -> Value {
        self.get("/v1/status?limit=1").await["counts"].clone()
    }
}

pub(super) fn count(counts: &Value, state: &str) -> u64 {
    counts[state]
        .as_u64()
        .unwrap_or_else(|| panic!("counts.{state} in {counts}"))
}

// ---------------------------------------------------------------------------
// Receipts and the end-state check

/// What the test enqueued: the id and whether its amount is 0.
pub(super) struct Expected {
    pub(super) receipt_id: String,
    pub(super) zero: bool,
}

/// Enqueue `n` receipts in one batch: every tenth has amount 0 (a worker skips
/// it), every fiftieth has an id that needs percent-encoding.
pub(super) async fn enqueue(server: &Server, n: usize) -> Vec<Expected> {
    let mut expected = Vec::with_capacity(n);
    let mut receipts = Vec::with_capacity(n);
    for i in 0..n {
        let receipt_id = if i % 50 == 7 {
            format!("ex/{i:04} é?#%+")
        } else {
            format!("ex-{i:04}")
        };
        let zero = i % 10 == 0;
        let amount = if zero { 0 } else { 100 + i };
        receipts.push(json!({
            "receipt_id": receipt_id,
            "finalized_at": 1_764_460_800 + i,
            "observation": {"amount_cents": amount},
        }));
        expected.push(Expected { receipt_id, zero });
    }
    let out = server
        .post("/v1/receipts/batch", json!({"receipts": receipts}))
        .await;
    let results = out["results"].as_array().expect("results");
    assert_eq!(results.len(), n);
    assert!(
        results.iter().all(|r| r["status"] == "created"),
        "every receipt created: {out}"
    );
    expected
}

/// Check that every receipt finished exactly once and the counts agree with
/// `/v1/status`; returns the number per final state.
pub(super) async fn check_end_state(
    server: &Server,
    expected: &[Expected],
) -> BTreeMap<String, u64> {
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    for e in expected {
        let view = server
            .get(&format!("/v1/receipts/{}", enc(&e.receipt_id)))
            .await;
        let id = &e.receipt_id;
        let state = view["state"].as_str().expect("state").to_owned();
        let history = view["history"].as_array().expect("history");
        let accepted = history
            .iter()
            .filter(|h| h["outcome"] == "accepted")
            .count();
        match state.as_str() {
            "settled" => {
                assert_eq!(accepted, 1, "{id}: one accepted entry: {view}");
                assert!(view["transcript_id"].is_string(), "{id}: {view}");
                assert!(!e.zero, "{id}: amount 0 must be skipped, not settled");
            }
            "skipped" => {
                assert_eq!(accepted, 0, "{id}: {view}");
                assert_eq!(view["skip_reason"], "zero_charge", "{id}: {view}");
                assert!(e.zero, "{id}: only amount 0 is skipped");
            }
            "dead_lettered" => {
                assert_eq!(accepted, 0, "{id}: {view}");
                assert!(view["dead_letter"].is_object(), "{id}: {view}");
                assert!(!e.zero, "{id}: amount 0 is skipped, never fails");
            }
            other => panic!("{id} did not finish: state {other}: {view}"),
        }
        assert!(view["lease"].is_null(), "{id}: no lease left: {view}");
        *tally.entry(state).or_default() += 1;
    }

    let counts = server.counts().await;
    for state in ["pending", "leased", "retry_scheduled"] {
        assert_eq!(count(&counts, state), 0, "{state}: {counts}");
    }
    for state in ["settled", "skipped", "dead_lettered"] {
        assert_eq!(
            count(&counts, state),
            tally.get(state).copied().unwrap_or(0),
            "/v1/status counts {state} like the receipts do: {counts}"
        );
    }

    // The dead-letter list, page by page, holds exactly the dead letters.
    let mut listed = 0;
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(cursor) => format!("/v1/dead-letters?limit=7&after={}", enc(cursor)),
            None => "/v1/dead-letters?limit=7".to_owned(),
        };
        let page = server.get(&path).await;
        listed += page["dead_letters"].as_array().expect("dead_letters").len() as u64;
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(listed, count(&counts, "dead_lettered"), "dead-letter pages");
    tally
}
