//! The load the crash falls on: a producer, workers that commit what they
//! claim, and the reclaim of what the killed server had leased.

use super::*;

/// Enqueue batches until told to stop, resending a batch whose answer was
/// lost until it is acknowledged (the store makes that idempotent).
pub(super) async fn producer(
    mut address: Address,
    stop: Arc<AtomicBool>,
    batch: usize,
    acked: Arc<Mutex<BTreeSet<String>>>,
    figures: Arc<Figures>,
) {
    let http = client();
    let mut seq = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<String> = (seq..seq + batch).map(|n| format!("r-{n:06}")).collect();
        seq += batch;
        let body = json!({"receipts": ids.iter().enumerate().map(|(i, id)| json!({
            "receipt_id": id,
            "finalized_at": 1_764_460_800u64,
            "observation": {"amount_cents": 100 + i, "id": id},
        })).collect::<Vec<_>>()});
        // Resend until acknowledged.
        loop {
            let base = current(&mut address).await;
            match http
                .post(format!("{base}/v1/receipts/batch"))
                .json(&body)
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => {
                    let Ok(out) = r.json::<Value>().await else {
                        figures.lost_answers.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let results = out["results"].as_array().expect("results");
                    assert_eq!(results.len(), ids.len());
                    let mut acked = acked.lock().unwrap();
                    for (id, result) in ids.iter().zip(results) {
                        let status = result["status"].as_str().unwrap_or_default();
                        assert!(
                            status == "created" || status == "existing",
                            "{id}: {result}"
                        );
                        acked.insert(id.clone());
                    }
                    break;
                }
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    figures
                        .unexpected
                        .lock()
                        .unwrap()
                        .push(format!("enqueue: {status} {text}"));
                }
                Err(_) => {
                    figures.lost_answers.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Claim, "settle" for a moment, report. A commit whose answer was lost is
/// sent again (to whichever server is up) until its lease deadline passes.
pub(super) async fn worker(
    name: String,
    mut address: Address,
    stop: Arc<AtomicBool>,
    mut rng: Rng,
    acks: Arc<Mutex<Vec<Ack>>>,
    figures: Arc<Figures>,
) {
    let http = client();
    while !stop.load(Ordering::Relaxed) {
        let base = current(&mut address).await;
        let claimed = http
            .post(format!("{base}/v1/claims"))
            .json(&json!({"worker_id": name, "lease_ms": LEASE_MS, "limit": 8, "wait_ms": 200}))
            .send()
            .await;
        let claims = match claimed {
            Ok(r) if r.status() == 200 => match r.json::<Value>().await {
                Ok(body) => body["claims"].as_array().cloned().unwrap_or_default(),
                Err(_) => continue,
            },
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                figures
                    .unexpected
                    .lock()
                    .unwrap()
                    .push(format!("claim: {status} {text}"));
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        for claim in claims {
            tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
            let id = claim["receipt_id"].as_str().expect("id").to_owned();
            let attempts = claim["attempts"].as_u64().expect("attempts");
            let until = claim["lease_until_ms"].as_u64().expect("until");
            let version = claim["row_version"].as_u64().expect("version");
            let (outcome, kind, transcript) = if attempts < MAX_RPC_FAILURES && rng.below(4) == 0 {
                (
                    json!({"kind": "retryable", "code": "rpc", "detail": format!("timeout {attempts}")}),
                    "retryable",
                    None,
                )
            } else {
                let tx = format!("tx-{id}-{version}");
                (
                    json!({"kind": "accepted", "transcript_id": tx}),
                    "accepted",
                    Some(tx),
                )
            };
            let body = json!({"claim": claim, "outcome": outcome});
            loop {
                let base = current(&mut address).await;
                let sent = http
                    .post(format!("{base}/v1/receipts/{id}/outcome"))
                    .json(&body)
                    .send()
                    .await;
                let answer = match sent {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        r.json::<Value>().await.map(|b| (status, b))
                    }
                    Err(e) => Err(e),
                };
                match answer {
                    Ok((200, route)) => {
                        let expected = if kind == "accepted" {
                            "no_action"
                        } else {
                            "retry_scheduled"
                        };
                        assert_eq!(route["kind"], expected, "{id}: {route}");
                        figures.acked_outcomes.fetch_add(1, Ordering::Relaxed);
                        acks.lock().unwrap().push(Ack {
                            receipt_id: id.clone(),
                            attempt: attempts + 1,
                            outcome: kind,
                            worker_id: name.clone(),
                            transcript_id: transcript.clone(),
                            route: expected.to_owned(),
                        });
                        break;
                    }
                    Ok((409, problem)) => {
                        assert!(
                            LEASE_LOST.contains(&problem["code"].as_str().unwrap_or_default()),
                            "{problem}"
                        );
                        assert_eq!(problem["class"], "conflict", "{problem}");
                        figures.conflicts.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Ok((status, body)) => {
                        figures
                            .unexpected
                            .lock()
                            .unwrap()
                            .push(format!("outcome: {status} {body}"));
                        break;
                    }
                    Err(_) => {
                        figures.lost_answers.fetch_add(1, Ordering::Relaxed);
                        if now_ms() > until + 50 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
    }
}

pub(super) async fn get(http: &reqwest::Client, url: String) -> Value {
    let r = http.get(&url).send().await.expect("GET");
    assert_eq!(r.status(), 200, "{url}");
    r.json().await.expect("json")
}

/// Right after a restart, before any worker can reach the new server. Every
/// lease was granted before the kill, so once `LEASE_MS` has passed since the
/// kill none may be live. Every active receipt that was claimed more often
/// than an outcome was recorded for it (`row_version` > history entries) had
/// its lease abandoned — typically by the crash — and must be claimable: it is
/// claimed by id and settled, as a worker would. Returns the acknowledged
/// outcomes.
pub(super) async fn reclaim_orphans(
    http: &reqwest::Client,
    base: &str,
    killed_at: Instant,
) -> Vec<Ack> {
    let expired = killed_at + Duration::from_millis(LEASE_MS + 50);
    tokio::time::sleep_until(expired.into()).await;
    let status = get(http, format!("{base}/v1/status?limit=4096")).await;
    assert_eq!(
        status["counts"]["leased"], 0,
        "a lease outlived its deadline across the restart: {}",
        status["counts"]
    );
    let ids = |state: &str| -> Vec<String> {
        status["samples"][state]["receipts"]
            .as_array()
            .expect("receipts")
            .iter()
            .map(|r| r["receipt_id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(status["samples"]["retry_scheduled"]["truncated"], false);
    // Work is claimed oldest first and ids grow with age, so the pending
    // receipts ever claimed come first in id order: stop after a run of
    // receipts never claimed (the rest of the backlog).
    let mut abandoned = Vec::new();
    for (state, ids) in [
        ("retry_scheduled", ids("retry_scheduled")),
        ("pending", ids("pending")),
    ] {
        let mut never_claimed = 0;
        for id in ids {
            let view = get(http, format!("{base}/v1/receipts/{id}")).await;
            let history = view["history"].as_array().expect("history").len() as u64;
            let version = view["row_version"].as_u64().expect("version");
            if version > history {
                abandoned.push(id);
                never_claimed = 0;
            } else if state == "pending" && version == 0 {
                never_claimed += 1;
                if never_claimed == 50 {
                    break;
                }
            }
        }
    }
    let mut acks = Vec::new();
    for id in &abandoned {
        let mut claimed = None;
        for _ in 0..20 {
            let r = http
                .post(format!("{base}/v1/receipts/{id}/claim"))
                .json(&json!({"worker_id": "reclaimer", "lease_ms": 5000}))
                .send()
                .await
                .expect("claim");
            let status = r.status().as_u16();
            let body: Value = r.json().await.expect("claim json");
            match status {
                200 => {
                    claimed = Some(body);
                    break;
                }
                // A retry not yet due (50 ms backoff).
                409 if body["code"] == "receipt_not_visible" => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ => panic!("{id}: an abandoned lease is not reclaimable: {status} {body}"),
            }
        }
        let claim = claimed.unwrap_or_else(|| panic!("{id} never became claimable"));
        let tx = format!("tx-{id}-reclaimed-{}", claim["row_version"]);
        let r = http
            .post(format!("{base}/v1/receipts/{id}/outcome"))
            .json(&json!({"claim": claim, "outcome": {"kind": "accepted", "transcript_id": tx}}))
            .send()
            .await
            .expect("outcome");
        assert_eq!(r.status(), 200, "{id}");
        acks.push(Ack {
            receipt_id: id.clone(),
            attempt: claim["attempts"].as_u64().expect("attempts") + 1,
            outcome: "accepted",
            worker_id: "reclaimer".into(),
            transcript_id: Some(tx),
            route: "no_action".into(),
        });
    }
    acks
}
