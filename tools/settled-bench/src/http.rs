//! The HTTP side: one shared client, batch enqueue, status, info, and the
//! per-receipt check at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use settled::domain::RetryPolicy;
use settled::http::wire::ReceiptIn;

use super::common::{Ids, Ledger, Res, err};
use super::tasks::in_chunks;

/// A client of one server.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: reqwest::Client,
}

/// `GET /v1/status` counts.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize)]
pub struct Counts {
    pub pending: u64,
    pub leased: u64,
    pub retry_scheduled: u64,
    pub settled: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
}

#[derive(Deserialize)]
struct StatusBody {
    counts: Counts,
}

#[derive(Deserialize)]
struct Entry {
    outcome: String,
}

#[derive(Deserialize)]
struct ReceiptBody {
    state: String,
    history: Vec<Entry>,
}

#[derive(Deserialize)]
struct BatchResult {
    status: String,
}

#[derive(Deserialize)]
struct BatchBody {
    results: Vec<BatchResult>,
}

impl Api {
    /// A client with a connection pool as large as needed and keep-alive.
    pub fn new(base: &str, token: Option<&str>) -> Res<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse()?,
            );
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(1024)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            client,
        })
    }

    /// POST a JSON body; the status and the body's bytes.
    pub async fn post<B: serde::Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Res<(u16, Vec<u8>)> {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.bytes().await?.to_vec()))
    }

    /// DELETE with a JSON body; the status.
    pub async fn delete<B: serde::Serialize + ?Sized>(&self, path: &str, body: &B) -> Res<u16> {
        let response = self
            .client
            .delete(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await?;
        Ok(response.status().as_u16())
    }

    /// GET and parse a 200 answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Res<T> {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        if !status.is_success() {
            return Err(err(format!(
                "GET {path}: {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    pub async fn counts(&self) -> Res<Counts> {
        Ok(self.get::<StatusBody>("/v1/status?limit=1").await?.counts)
    }

    /// The server's backend name and retry policy.
    pub async fn info(&self) -> Res<(String, RetryPolicy)> {
        let info: serde_json::Value = self.get("/v1/info").await?;
        let backend = info["backend"]
            .as_str()
            .ok_or_else(|| err("/v1/info has no backend"))?
            .to_owned();
        let p = &info["retry_policy"];
        let field = |name: &str| {
            p[name]
                .as_u64()
                .ok_or_else(|| err(format!("/v1/info has no retry_policy.{name}")))
        };
        let policy = RetryPolicy::new(
            u32::try_from(field("max_retries")?)?,
            field("initial_backoff_ms")?,
            u32::try_from(field("backoff_multiplier")?)?,
            field("backoff_cap_ms")?,
        )?;
        Ok((backend, policy))
    }

    /// Enqueue receipts `0..n` of `ids` via `POST /v1/receipts/batch`, `producers`
    /// requests at a time. Returns how many were not created.
    pub async fn enqueue(
        &self,
        ids: &Ids,
        n: usize,
        chunk: usize,
        producers: usize,
        visible_at_ms: Option<u64>,
        label: &str,
    ) -> Res<u64> {
        let chunk = chunk.clamp(1, settled::http::wire::MAX_BATCH_ITEMS);
        let refused = Arc::new(AtomicU64::new(0));
        let (api, ids, counted) = (self.clone(), ids.clone(), refused.clone());
        in_chunks(n, chunk, producers, label, move |range| {
            let (api, ids, refused) = (api.clone(), ids.clone(), counted.clone());
            async move {
                let receipts: Vec<ReceiptIn> = range
                    .map(|i| ReceiptIn {
                        receipt_id: ids.id(i),
                        finalized_at: Ids::finalized_at(i),
                        observation: Some(serde_json::json!({"amount_cents": i})),
                        visible_at_ms,
                        group: ids.group(i),
                        priority: None,
                        traceparent: None,
                        tracestate: None,
                    })
                    .collect();
                let body = serde_json::json!({ "receipts": receipts });
                let (status, bytes) = api.post("/v1/receipts/batch", &body).await?;
                if status != 200 {
                    return Err(err(format!(
                        "POST /v1/receipts/batch: {status}: {}",
                        String::from_utf8_lossy(&bytes)
                    )));
                }
                let body: BatchBody = serde_json::from_slice(&bytes)?;
                let ok = body.results.iter().filter(|r| r.status == "created");
                let ok = ok.count();
                refused.fetch_add((receipts.len() - ok) as u64, Ordering::Relaxed);
                Ok(ok)
            }
        })
        .await?;
        Ok(refused.load(Ordering::Relaxed))
    }

    /// Read receipts back (all when `n <= all_up_to`, else an even sample of
    /// `sample`): each must be finished, and accepted once exactly when the
    /// client saw it accepted. Returns how many were read.
    pub async fn verify(
        &self,
        ids: &Ids,
        ledger: &Arc<Ledger>,
        (all_up_to, sample): (usize, usize),
        concurrency: usize,
        failures: &mut Vec<String>,
    ) -> Res<usize> {
        let n = ledger.n();
        let picks: Arc<Vec<usize>> = Arc::new(if n <= all_up_to {
            (0..n).collect()
        } else {
            let step = n as f64 / sample.max(1) as f64;
            (0..sample.min(n))
                .map(|k| (k as f64 * step) as usize)
                .collect()
        });
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let (api, ids, ledger) = (self.clone(), ids.clone(), ledger.clone());
            let (picks, next) = (picks.clone(), next.clone());
            tasks.spawn(async move {
                let mut bad = Vec::new();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = picks.get(k) else {
                        return Ok::<_, super::common::BenchError>(bad);
                    };
                    let id = ids.id(index);
                    let view: ReceiptBody = api.get(&format!("/v1/receipts/{id}")).await?;
                    let accepted = view
                        .history
                        .iter()
                        .filter(|e| e.outcome == "accepted")
                        .count();
                    let expected = if ledger.was_accepted(index) {
                        view.state == "settled" && accepted == 1
                    } else {
                        matches!(view.state.as_str(), "dead_lettered" | "skipped") && accepted == 0
                    };
                    if !expected {
                        bad.push(format!(
                            "{id}: state {} with {accepted} accepted history entries",
                            view.state
                        ));
                    }
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let bad = joined.map_err(|e| err(format!("verifier failed: {e}")))??;
            for line in bad.into_iter().take(5) {
                failures.push(format!("http: {line}"));
            }
        }
        Ok(picks.len())
    }
}
