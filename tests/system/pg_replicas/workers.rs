//! The replicas' processes and the HTTP workers, producer and checks that
//! drive them.

use super::rail::*;
use super::*;

/// Per-replica args for the load test.
pub(super) fn replica_args(url: &str) -> Vec<String> {
    [
        "--database-url",
        url,
        "--max-retries",
        &MAX_RETRIES.to_string(),
        "--initial-backoff-ms",
        "10",
        "--backoff-cap-ms",
        "50",
        "--pg-max-connections",
        "6",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

pub(super) async fn worker(
    client: reqwest::Client,
    base: String,
    name: String,
    batches: bool,
    produced: Arc<AtomicBool>,
    deadline: Instant,
) -> Tally {
    let mut rng = Rng::new();
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let limit = if batches { 2 + rng.below(7) } else { 1 };
        let request =
            json!({"worker_id": name, "lease_ms": LEASE_MS, "limit": limit, "wait_ms": WAIT_MS});
        let claim_sent = Instant::now();
        let claim_sent_ms = now_ms();
        let (status, body) = post(&client, &format!("{base}/v1/claims"), &request).await;
        let claim_back = Instant::now();
        let claim_back_ms = now_ms();
        tally.claim_calls += 1;
        if status != 200 {
            tally
                .violations
                .push(format!("{name}: claim answered {status} {body}"));
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let claims = body["claims"].as_array().cloned().unwrap_or_default();
        if claims.is_empty() {
            tally.empty_claims += 1;
            if produced.load(Ordering::SeqCst) {
                let (_, status) = get(&client, &format!("{base}/v1/status?limit=1")).await;
                let counts = &status["counts"];
                let open: u64 = ["pending", "leased", "retry_scheduled"]
                    .iter()
                    .map(|s| counts[*s].as_u64().expect("count"))
                    .sum();
                if open == 0 {
                    break;
                }
            }
            continue;
        }
        tally.claimed += claims.len() as u64;
        for claim in &claims {
            tally.check_deadline(claim, claim_sent_ms, claim_back_ms);
        }
        // "Settle" on the rail: slow enough that some leases run out meanwhile.
        tokio::time::sleep(Duration::from_millis(rng.below(SLOWEST_COMMIT_MS + 1))).await;
        let outcomes: Vec<Value> = claims.iter().map(outcome_for).collect();
        let sent = Instant::now();
        if batches {
            let items: Vec<Value> = claims
                .iter()
                .zip(&outcomes)
                .map(|(claim, outcome)| json!({"claim": claim, "outcome": outcome}))
                .collect();
            let (status, body) = post(
                &client,
                &format!("{base}/v1/outcomes"),
                &json!({"outcomes": items}),
            )
            .await;
            let timing = Timing::new(claim_sent, claim_back, sent);
            if status != 200 {
                tally
                    .violations
                    .push(format!("{name}: outcome batch answered {status} {body}"));
                continue;
            }
            let results = body["results"].as_array().cloned().unwrap_or_default();
            assert_eq!(results.len(), claims.len(), "one result per item");
            for ((claim, outcome), result) in claims.iter().zip(&outcomes).zip(&results) {
                assert_eq!(
                    result["receipt_id"], claim["receipt_id"],
                    "results in order"
                );
                let answer = match (&result["route"], &result["error"]) {
                    (route, Value::Null) => Ok(route),
                    (_, problem) => Err((
                        u16::try_from(problem["status"].as_u64().unwrap_or(0)).unwrap_or(0),
                        problem,
                    )),
                };
                tally.judge(claim, outcome, answer, timing);
            }
        } else {
            let (claim, outcome) = (&claims[0], &outcomes[0]);
            let id = claim["receipt_id"].as_str().expect("receipt_id");
            let (status, body) = post(
                &client,
                &format!("{base}/v1/receipts/{id}/outcome"),
                &json!({"claim": claim, "outcome": outcome}),
            )
            .await;
            let timing = Timing::new(claim_sent, claim_back, sent);
            let answer = if status == 200 {
                Ok(&body)
            } else {
                Err((status, &body))
            };
            tally.judge(claim, outcome, answer, timing);
        }
    }
    tally
}

/// Enqueue every receipt in batches, round-robin over the replicas.
pub(super) async fn produce(client: reqwest::Client, bases: Vec<String>) -> usize {
    let mut created = 0;
    for (n, start) in (0..RECEIPTS).step_by(ENQUEUE_BATCH).enumerate() {
        let receipts: Vec<Value> = (start..(start + ENQUEUE_BATCH).min(RECEIPTS))
            .map(|i| {
                json!({"receipt_id": receipt_id(i), "finalized_at": 1_764_460_800 + i as u64,
                "observation": {"amount_cents": 100 + i}})
            })
            .collect();
        let base = &bases[n % bases.len()];
        created += enqueue_batch(&client, base, receipts).await;
        // Producers trickle work in while the workers run.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    created
}

pub(super) async fn store_bindings(client: &reqwest::Client, replicas: &[Server]) -> Vec<String> {
    let mut bindings = Vec::new();
    for replica in replicas {
        let (status, info) = get(client, &format!("{}/v1/info", replica.base)).await;
        assert_eq!(status, 200, "{info}");
        assert_eq!(info["backend"], "postgres");
        let binding = info["store_binding"].as_str().expect("binding").to_owned();
        assert_eq!(binding.len(), 64);
        bindings.push(binding);
    }
    bindings
}

/// Read every receipt back, spread over the replicas, and check it against
/// what the workers saw.
pub(super) async fn check_receipt(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    seen: Option<&Seen>,
) -> Result<bool, String> {
    let (status, view) = get(client, &format!("{base}/v1/receipts/{id}")).await;
    if status != 200 {
        return Err(format!("{id}: GET answered {status} {view}"));
    }
    let kind = kind(index_of(id));
    let (invocations, settles) = expected_end(kind);
    let empty = Seen::default();
    let seen = seen.unwrap_or(&empty);
    let history = view["history"].as_array().cloned().unwrap_or_default();
    let count = |outcome: &str| history.iter().filter(|h| h["outcome"] == outcome).count();
    let fail = |what: &str| {
        Err(format!(
            "{id} ({kind:?}): {what}; seen {seen:?}; view {view}"
        ))
    };
    if history.len() != invocations as usize {
        return fail(&format!(
            "{} history entries, expected {invocations}",
            history.len()
        ));
    }
    for (n, entry) in history.iter().enumerate() {
        if entry["attempt"].as_u64() != Some(n as u64 + 1) {
            return fail("history attempts are not 1, 2, ...");
        }
    }
    if seen.accepted.len() > 1 {
        return fail("accepted by two workers");
    }
    let retry_entries = history
        .iter()
        .filter(|h| h["route"] == "retry_scheduled")
        .count();
    if seen.retried as usize != retry_entries {
        return fail("retries answered 200 differ from retry entries");
    }
    if settles {
        if view["state"] != "settled" {
            return fail("not settled");
        }
        if count("accepted") != 1 || seen.accepted.len() != 1 {
            return fail("not exactly one accepted entry and one accepted commit");
        }
        if view["transcript_id"] != seen.accepted[0].as_str() {
            return fail("stored transcript is not the one whose commit was acknowledged");
        }
        Ok(true)
    } else {
        if view["state"] != "dead_lettered" {
            return fail("not dead-lettered");
        }
        let dead_entries = history
            .iter()
            .filter(|h| h["route"] == "dead_lettered")
            .count();
        if count("accepted") != 0 || !seen.accepted.is_empty() || dead_entries != 1 {
            return fail("a dead letter was accepted, or not dead-lettered exactly once");
        }
        if seen.dead_lettered + seen.replays == 0 {
            return fail("no worker saw the dead-letter route");
        }
        if view["attempts"].as_u64() != Some(u64::from(invocations)) {
            return fail("wrong attempts");
        }
        Ok(false)
    }
}
