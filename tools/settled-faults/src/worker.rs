//! The workers of [`Workload`]: claim (a batch or one), work, then report
//! every kind of outcome one by one or batched, extend or release a lease,
//! resending a commit whose answer was lost while the lease lasts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use settled_test_support::rng::Rng;

use super::{Reply, Workload};
use crate::record::{Answer, OpKind};

impl Workload {
    /// A worker: claims (a batch of up to `batch`, or one), works, reports.
    pub async fn work(self: Arc<Self>, index: usize, batch: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let worker = format!("worker-{index}");
        while !self.stop_working.load(Ordering::SeqCst) {
            let limit = if batch > 1 { 1 + rng.index(batch) } else { 1 };
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
            if self.hold_workers.load(Ordering::SeqCst) || rng.index(100) < 2 {
                tokio::time::sleep(Duration::from_millis(self.lease_ms + 300)).await;
            } else {
                tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
            }
            let mut outcomes = Vec::new();
            for mut h in held {
                match rng.index(100) {
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
        match rng.index(100) {
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
