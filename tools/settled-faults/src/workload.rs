//! Producers and workers, written as a client in another language would write
//! them against the HTTP contract: idempotent enqueue resent until
//! acknowledged, claims in batches and one by one, heartbeats, every kind of
//! outcome, releases, and commits resent after a lost answer while the lease
//! lasts. Every request is recorded with its answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{Value, json};

use settled_test_support::rng::Rng;

use super::record::{Answer, Op, OpKind, Recorder};

// The worker's side: claims, outcomes, heartbeats and releases.
#[path = "worker.rs"]
mod worker;

/// How a request ended, as a client sees it.
pub enum Reply {
    /// 2xx, with its body (`Null` for 204).
    Ok(Value),
    /// 4xx: refused, with its status and the problem's `code`.
    Refused(u16, String),
    /// 5xx, a timeout or a broken connection: it may have happened.
    Unknown,
}

impl Reply {
    fn answer(&self) -> Answer {
        match self {
            Self::Ok(_) => Answer::Ok,
            Self::Refused(_, code) => Answer::Refused(code.clone()),
            Self::Unknown => Answer::Unknown,
        }
    }
}

/// What producers and workers share.
pub struct Workload {
    pub rec: Arc<Recorder>,
    client: reqwest::Client,
    /// Each replica's address; empty while it is down.
    targets: Vec<Arc<RwLock<String>>>,
    run: String,
    next_receipt: AtomicU64,
    /// Receipts enqueued per second, all producers together.
    pub rate: u64,
    pub lease_ms: u64,
    /// Producers stop starting new batches (they finish the one they hold).
    pub stop_producing: AtomicBool,
    /// Workers stop once their current claims are done.
    pub stop_working: AtomicBool,
    /// The "workers paused" fault: work claimed meanwhile is held past its lease.
    pub hold_workers: AtomicBool,
}

impl Workload {
    pub fn new(
        rec: Arc<Recorder>,
        targets: Vec<Arc<RwLock<String>>>,
        run: &str,
        rate: u64,
        lease_ms: u64,
    ) -> reqwest::Result<Self> {
        // Shorter than a server pause, so that a paused server reads as a
        // lost answer, as it would to a client with a sensible timeout.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(4))
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            rec,
            client,
            targets,
            run: run.to_owned(),
            next_receipt: AtomicU64::new(0),
            rate,
            lease_ms,
            stop_producing: AtomicBool::new(false),
            stop_working: AtomicBool::new(false),
            hold_workers: AtomicBool::new(false),
        })
    }

    /// A live replica's address, chosen at random.
    fn pick(&self, rng: &mut Rng) -> Option<String> {
        let live: Vec<String> = self
            .targets
            .iter()
            .map(|t| t.read().unwrap_or_else(|p| p.into_inner()).clone())
            .filter(|b| !b.is_empty())
            .collect();
        (!live.is_empty()).then(|| live[rng.index(live.len())].clone())
    }

    /// How many replicas there are (live or not).
    pub fn replicas(&self) -> usize {
        self.targets.len()
    }

    /// Replica `i`'s address (empty while it is down).
    pub fn base(&self, i: usize) -> String {
        self.targets[i]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `GET path` of one replica (not recorded): its JSON body on a 2xx.
    pub async fn get(&self, base: &str, path: &str) -> Option<Value> {
        let response = self
            .client
            .get(format!("{base}{path}"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// Send one request to some live replica.
    pub async fn call(
        &self,
        rng: &mut Rng,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Reply {
        let Some(base) = self.pick(rng) else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Reply::Unknown;
        };
        let mut request = self.client.request(method, format!("{base}{path}"));
        if let Some(body) = body {
            request = request.json(body);
        }
        let Ok(response) = request.send().await else {
            return Reply::Unknown;
        };
        let status = response.status();
        let Ok(bytes) = response.bytes().await else {
            return Reply::Unknown;
        };
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            Reply::Ok(value)
        } else if status.is_client_error() {
            Reply::Refused(
                status.as_u16(),
                value["code"].as_str().unwrap_or("unknown").to_owned(),
            )
        } else {
            Reply::Unknown
        }
    }

    fn record(&self, receipt: &str, worker: &str, sent_ms: u64, answer: Answer, kind: OpKind) {
        self.rec.op(Op {
            receipt: receipt.to_owned(),
            worker: worker.to_owned(),
            sent_ms,
            answered_ms: self.rec.now_ms(),
            answer,
            kind,
        });
    }

    /// A producer: batches of 1–16 receipts at the shared rate, each batch
    /// resent until it is acknowledged (enqueue is idempotent).
    pub async fn produce(self: Arc<Self>, producers: u64, seed: u64) {
        let mut rng = Rng::new(seed);
        let name = format!("producer-{seed}");
        while !self.stop_producing.load(Ordering::SeqCst) {
            let n = 1 + rng.below(16);
            let first = self.next_receipt.fetch_add(n, Ordering::SeqCst);
            let ids: Vec<String> = (first..first + n)
                .map(|k| format!("{}-{k}", self.run))
                .collect();
            let items: Vec<Value> = ids
                .iter()
                .zip(first..)
                .map(|(id, k)| json!({"receipt_id": id, "finalized_at": 1_764_460_800 + k, "observation": {"amount": k}}))
                .collect();
            loop {
                let sent = self.rec.now_ms();
                let single = items.len() == 1;
                let reply = if single {
                    self.call(
                        &mut rng,
                        reqwest::Method::POST,
                        "/v1/receipts",
                        Some(&items[0]),
                    )
                    .await
                } else {
                    let body = json!({"receipts": items});
                    self.call(
                        &mut rng,
                        reqwest::Method::POST,
                        "/v1/receipts/batch",
                        Some(&body),
                    )
                    .await
                };
                match &reply {
                    Reply::Ok(body) if !single => {
                        let results = body["results"].as_array().cloned().unwrap_or_default();
                        for (id, result) in ids
                            .iter()
                            .zip(results.iter().chain(std::iter::repeat(&Value::Null)))
                        {
                            let answer = match result["status"].as_str() {
                                Some("created" | "existing") => Answer::Ok,
                                Some(other) => Answer::Refused(other.to_owned()),
                                None => Answer::Unknown,
                            };
                            self.record(id, &name, sent, answer, OpKind::Enqueue);
                        }
                    }
                    _ => {
                        for id in &ids {
                            self.record(id, &name, sent, reply.answer(), OpKind::Enqueue);
                        }
                    }
                }
                // Resent until acknowledged; a refusal other than "too many
                // requests" would be refused again (and is counted by the check).
                if matches!(reply, Reply::Ok(_))
                    || matches!(reply, Reply::Refused(s, _) if s != 429)
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Pace: this producer's share of the rate.
            let pause_ms = n * 1_000 * producers / self.rate.max(1);
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
    }

    /// `GET /v1/status` counts summed by `active` (pending, leased, retry
    /// scheduled) and in all; `None` when no replica answered.
    pub async fn counts(&self, rng: &mut Rng) -> Option<(u64, u64)> {
        let Reply::Ok(body) = self
            .call(rng, reqwest::Method::GET, "/v1/status?limit=1", None)
            .await
        else {
            return None;
        };
        let counts = body["counts"].as_object()?;
        let get = |k: &str| counts.get(k).and_then(Value::as_u64).unwrap_or(0);
        let active = get("pending") + get("leased") + get("retry_scheduled");
        // `scheduled` and `held` are counted in their states too, so not added again.
        let total = counts
            .iter()
            .filter(|(state, _)| !matches!(state.as_str(), "scheduled" | "held"))
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        Some((active, total))
    }

    /// A receipt as stored (`Ok(None)`: 404), read until some replica answers.
    pub async fn receipt(&self, rng: &mut Rng, id: &str) -> Option<Value> {
        let path = format!("/v1/receipts/{id}");
        for _ in 0..600 {
            match self.call(rng, reqwest::Method::GET, &path, None).await {
                Reply::Ok(body) => return Some(body),
                Reply::Refused(404, _) => return Some(Value::Null),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        None
    }
}
