//! Producers and workers, written as a client in another language would write
//! them against the HTTP contract: idempotent enqueue resent until
//! acknowledged, claims in batches and one by one, heartbeats, every kind of
//! outcome, releases, and commits resent after a lost answer while the lease
//! lasts. Every request is recorded with its answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{Value, json};

use super::record::{Answer, Op, OpKind, Recorder};
use super::rng::Rng;

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
        (!live.is_empty()).then(|| live[rng.below(live.len())].clone())
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
            let n = 1 + rng.below(16) as u64;
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

    /// A worker: claims (a batch of up to `batch`, or one), works, reports.
    pub async fn work(self: Arc<Self>, index: usize, batch: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let worker = format!("worker-{index}");
        while !self.stop_working.load(Ordering::SeqCst) {
            let limit = if batch > 1 { 1 + rng.below(batch) } else { 1 };
            let body = json!({"worker_id": worker, "lease_ms": self.lease_ms, "limit": limit, "wait_ms": 500});
            let sent = self.rec.now_ms();
            let Reply::Ok(answer) = self
                .call(&mut rng, reqwest::Method::POST, "/v1/claims", Some(&body))
                .await
            else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let claims = answer["claims"].as_array().cloned().unwrap_or_default();
            let mut held = Vec::new();
            for claim in claims {
                let Some(token) = claim["lease_token"].as_str().map(str::to_owned) else {
                    continue;
                };
                let receipt = claim["receipt_id"].as_str().unwrap_or_default().to_owned();
                let kind = OpKind::Claim {
                    token: token.clone(),
                    row_version: claim["row_version"].as_u64().unwrap_or(0),
                    lease_ms: self.lease_ms,
                };
                self.record(&receipt, &worker, sent, Answer::Ok, kind);
                held.push(Held {
                    receipt,
                    token,
                    claim,
                    claimed_ms: sent,
                });
            }
            if held.is_empty() {
                continue;
            }
            // A paused worker, or now and then one that dawdles on purpose:
            // its commits come after the lease and must all be refused.
            if self.hold_workers.load(Ordering::SeqCst) || rng.below(100) < 2 {
                tokio::time::sleep(Duration::from_millis(self.lease_ms + 300)).await;
            } else {
                tokio::time::sleep(Duration::from_millis(rng.below(20) as u64)).await;
            }
            let mut outcomes = Vec::new();
            for mut h in held {
                match rng.below(100) {
                    0..6 => self.release(&mut rng, &worker, &h).await,
                    6..12 => {
                        self.extend(&mut rng, &worker, &mut h).await;
                        outcomes.push((h, self.outcome(&mut rng)));
                    }
                    _ => outcomes.push((h, self.outcome(&mut rng))),
                }
            }
            if batch > 1 {
                self.report_batch(&mut rng, &worker, outcomes).await;
            } else {
                for (h, outcome) in outcomes {
                    self.report_one(&mut rng, &worker, &h, &outcome).await;
                }
            }
        }
    }

    /// An outcome of every kind, mostly `accepted`.
    fn outcome(&self, rng: &mut Rng) -> Value {
        match rng.below(100) {
            0..8 => json!({"kind": "retryable", "code": "rpc", "detail": "rail timed out"}),
            8..12 => {
                json!({"kind": "permanent", "code": "invalid_receipt_signature", "detail": "bad signature"})
            }
            12..18 => json!({"kind": "skipped", "reason": "zero_charge"}),
            _ => json!({"kind": "accepted", "transcript_id": format!("tx-{}", rng.token())}),
        }
    }

    fn outcome_kind(h: &Held, outcome: &Value) -> OpKind {
        OpKind::Outcome {
            token: h.token.clone(),
            outcome: outcome["kind"].as_str().unwrap_or_default().to_owned(),
            transcript_id: outcome["transcript_id"].as_str().map(str::to_owned),
        }
    }

    async fn report_one(&self, rng: &mut Rng, worker: &str, h: &Held, outcome: &Value) {
        let path = format!("/v1/receipts/{}/outcome", h.receipt);
        let body = json!({"claim": h.claim, "outcome": outcome});
        loop {
            let sent = self.rec.now_ms();
            let reply = self
                .call(rng, reqwest::Method::POST, &path, Some(&body))
                .await;
            self.record(
                &h.receipt,
                worker,
                sent,
                reply.answer(),
                Self::outcome_kind(h, outcome),
            );
            if !matches!(reply, Reply::Unknown) || self.rec.now_ms() >= h.claimed_ms + self.lease_ms
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn report_batch(&self, rng: &mut Rng, worker: &str, mut pending: Vec<(Held, Value)>) {
        while !pending.is_empty() {
            let items: Vec<Value> = pending
                .iter()
                .map(|(h, o)| json!({"claim": h.claim, "outcome": o}))
                .collect();
            let body = json!({"outcomes": items});
            let sent = self.rec.now_ms();
            let reply = self
                .call(rng, reqwest::Method::POST, "/v1/outcomes", Some(&body))
                .await;
            let mut again = Vec::new();
            match reply {
                Reply::Ok(answer) => {
                    let results = answer["results"].as_array().cloned().unwrap_or_default();
                    for ((h, o), result) in pending
                        .into_iter()
                        .zip(results.iter().chain(std::iter::repeat(&Value::Null)))
                    {
                        let item = if result.get("route").is_some() {
                            Answer::Ok
                        } else if let Some(code) = result["error"]["code"].as_str() {
                            // An item's 5xx-class error may have happened.
                            if result["error"]["status"].as_u64().is_some_and(|s| s >= 500) {
                                Answer::Unknown
                            } else {
                                Answer::Refused(code.to_owned())
                            }
                        } else {
                            Answer::Unknown
                        };
                        let retry = item == Answer::Unknown;
                        self.record(&h.receipt, worker, sent, item, Self::outcome_kind(&h, &o));
                        if retry {
                            again.push((h, o));
                        }
                    }
                }
                other => {
                    for (h, o) in pending {
                        self.record(
                            &h.receipt,
                            worker,
                            sent,
                            other.answer(),
                            Self::outcome_kind(&h, &o),
                        );
                        if matches!(other, Reply::Unknown) {
                            again.push((h, o));
                        }
                    }
                }
            }
            // A lost answer is resent while the lease lasts by this worker's
            // reckoning (from when the claim was sent), as the SDKs do.
            again.retain(|(h, _)| self.rec.now_ms() < h.claimed_ms + self.lease_ms);
            pending = again;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    async fn extend(&self, rng: &mut Rng, worker: &str, h: &mut Held) {
        let path = format!("/v1/receipts/{}/lease", h.receipt);
        let body = json!({"claim": h.claim, "extend_ms": self.lease_ms});
        let sent = self.rec.now_ms();
        let reply = self
            .call(rng, reqwest::Method::POST, &path, Some(&body))
            .await;
        let kind = OpKind::Extend {
            token: h.token.clone(),
            extend_ms: self.lease_ms,
        };
        self.record(&h.receipt, worker, sent, reply.answer(), kind);
        if let Reply::Ok(claim) = reply {
            h.claim = claim;
            h.claimed_ms = sent;
        }
    }

    async fn release(&self, rng: &mut Rng, worker: &str, h: &Held) {
        let path = format!("/v1/receipts/{}/lease", h.receipt);
        let body = json!({"claim": h.claim});
        let sent = self.rec.now_ms();
        let reply = self
            .call(rng, reqwest::Method::DELETE, &path, Some(&body))
            .await;
        let kind = OpKind::Release {
            token: h.token.clone(),
        };
        self.record(&h.receipt, worker, sent, reply.answer(), kind);
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

/// A claim a worker holds.
struct Held {
    receipt: String,
    token: String,
    /// The claim as last answered (sent back with every commit).
    claim: Value,
    /// When the request that granted (or last extended) it was sent.
    claimed_ms: u64,
}
