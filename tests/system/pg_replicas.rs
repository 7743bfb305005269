//! Several real `settled` processes on one PostgreSQL database: workers race
//! over HTTP with short leases and slow commits, and every rule still holds
//! across the replicas: nothing lost, nothing accepted twice, every late
//! commit refused, one store binding, and wakeups that cross replicas.
//!
//! Runs when `SETTLED_TEST_POSTGRES_URL` names a PostgreSQL server; prints
//! SKIPPED and passes otherwise.

use crate::common;
use crate::common::LEASE_LOST;
use crate::common::process::{Launch, Server};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

const RECEIPTS: usize = 2_000;
const ENQUEUE_BATCH: usize = 100;
const REPLICAS: usize = 3;
const WORKERS_PER_REPLICA: usize = 8;
const LEASE_MS: u64 = 400;
/// Workers "settle" for a random 0..=SLOWEST_COMMIT_MS before reporting, so
/// that about a third of the leases run out while their worker works.
const SLOWEST_COMMIT_MS: u64 = 600;
const WAIT_MS: u64 = 1_000;
const MAX_RETRIES: u32 = 3;
/// The whole workload must finish well inside this.
const WORKLOAD_BOUND: Duration = Duration::from_secs(50);

/// Start `n` replicas at once (they migrate the same fresh database
/// concurrently); their log lines, but for the listening one, are shown.
async fn start_replicas(dir: &std::path::Path, n: usize, args: &[&str]) -> Vec<Server> {
    let starting: Vec<_> = (0..n)
        .map(|_| Launch::new(dir).args(args).echo().spawn())
        .collect();
    let mut replicas = Vec::new();
    for replica in starting {
        replicas.push(replica.ready_async().await);
    }
    replicas
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Unix ms on the same clock as the servers (they run on this machine).
fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis(),
    )
    .expect("ms fit u64")
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{url}: not JSON ({e})"))
    };
    (status, body)
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    send(client, reqwest::Method::GET, url, None).await
}

pub(crate) async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    send(client, reqwest::Method::POST, url, Some(body)).await
}

/// A small xorshift generator seeded from the OS: enough to spread sleeps.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).expect("rng seed");
        Self(u64::from_le_bytes(seed) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn receipt_id(index: usize) -> String {
    format!("r-{index:05}")
}

fn index_of(receipt_id: &str) -> usize {
    receipt_id[2..].parse().expect("receipt index")
}

/// What the rail does with a receipt, fixed by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Accepted at once.
    Accept,
    /// `rpc` on the first invocation, accepted on the second.
    FlakyThenAccept,
    /// `rpc` every time: dead-lettered after `MAX_RETRIES` retries.
    AlwaysRpc,
    /// A permanent failure: dead-lettered at once.
    Permanent,
}

fn kind(index: usize) -> Kind {
    match index % 20 {
        0 => Kind::Permanent,
        3 | 13 => Kind::AlwaysRpc,
        1 | 6 | 11 | 16 => Kind::FlakyThenAccept,
        _ => Kind::Accept,
    }
}

/// Invocations a receipt of this kind takes, and whether it ends settled.
const fn expected_end(kind: Kind) -> (u32, bool) {
    match kind {
        Kind::Accept => (1, true),
        Kind::FlakyThenAccept => (2, true),
        Kind::AlwaysRpc => (MAX_RETRIES + 1, false),
        Kind::Permanent => (1, false),
    }
}

/// The outcome a worker reports for `claim`. A failure's detail depends only
/// on the receipt and attempt, so a late identical dead-letter decision is a
/// replay the store answers with the same route (docs/concepts.md: a replayed dead-letter decision).
fn outcome_for(claim: &Value) -> Value {
    let id = claim["receipt_id"].as_str().expect("receipt_id");
    let attempts = claim["attempts"].as_u64().expect("attempts");
    let rpc = json!({"kind": "retryable", "code": "rpc",
        "detail": format!("rail timed out on {id} at attempt {attempts}")});
    match kind(index_of(id)) {
        Kind::Permanent => json!({"kind": "permanent", "code": "invalid_receipt_signature",
            "detail": format!("signature of {id} rejected")}),
        Kind::AlwaysRpc => rpc,
        Kind::FlakyThenAccept if attempts == 0 => rpc,
        Kind::Accept | Kind::FlakyThenAccept => json!({"kind": "accepted",
            // Unique per claim: row_version grows with every claim.
            "transcript_id": format!("tx-{id}-v{}-{}", claim["row_version"], claim["lease_owner"].as_str().unwrap_or_default())}),
    }
}

/// What the client side saw for one receipt.
#[derive(Debug, Default)]
struct Seen {
    /// Transcript ids of accepted outcomes answered 200 `no_action`.
    accepted: Vec<String>,
    /// 200 `retry_scheduled` answers.
    retried: u32,
    /// 200 `dead_lettered` answers for commits made in time.
    dead_lettered: u32,
    /// 200 `dead_lettered` answers to late identical dead-letter decisions.
    replays: u32,
}

/// Everything one worker (or all of them) saw.
#[derive(Debug, Default)]
struct Tally {
    claim_calls: u64,
    empty_claims: u64,
    claimed: u64,
    commits: u64,
    /// 409 `lease_conflict` answers.
    conflicts: u64,
    /// Commits sent at or after their lease deadline.
    late: u64,
    /// Late commits refused with 409 `lease_conflict`.
    late_refused: u64,
    /// Late identical dead-letter decisions answered with the same route.
    late_replayed: u64,
    /// Commits whose deadline fell while the request was in flight.
    borderline: u64,
    violations: Vec<String>,
    per_receipt: HashMap<String, Seen>,
}

impl Tally {
    fn merge(&mut self, other: Self) {
        self.claim_calls += other.claim_calls;
        self.empty_claims += other.empty_claims;
        self.claimed += other.claimed;
        self.commits += other.commits;
        self.conflicts += other.conflicts;
        self.late += other.late;
        self.late_refused += other.late_refused;
        self.late_replayed += other.late_replayed;
        self.borderline += other.borderline;
        self.violations.extend(other.violations);
        for (id, seen) in other.per_receipt {
            let mine = self.per_receipt.entry(id).or_default();
            mine.accepted.extend(seen.accepted);
            mine.retried += seen.retried;
            mine.dead_lettered += seen.dead_lettered;
            mine.replays += seen.replays;
        }
    }

    /// Judge one commit: `answer` is `Ok(route)` or `Err(problem)`, the
    /// request having left at `sent_ms` and come back at `back_ms`.
    fn judge(
        &mut self,
        claim: &Value,
        outcome: &Value,
        answer: Result<&Value, (u16, &Value)>,
        sent_ms: u64,
        back_ms: u64,
    ) {
        let id = claim["receipt_id"].as_str().expect("receipt_id").to_owned();
        let until = claim["lease_until_ms"].as_u64().expect("lease_until_ms");
        let attempts = claim["attempts"].as_u64().expect("attempts");
        let late = sent_ms >= until;
        let in_time = back_ms < until;
        self.commits += 1;
        if late {
            self.late += 1;
        } else if !in_time {
            self.borderline += 1;
        }
        let what = outcome["kind"].as_str().unwrap_or_default();
        match answer {
            Ok(route) => {
                let seen = self.per_receipt.entry(id.clone()).or_default();
                match (what, route["kind"].as_str().unwrap_or_default()) {
                    ("accepted", "no_action") if !late => seen.accepted.push(
                        outcome["transcript_id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ),
                    ("retryable", "retry_scheduled")
                        if !late && route["attempt"].as_u64() == Some(attempts + 1) =>
                    {
                        seen.retried += 1;
                    }
                    ("retryable" | "permanent", "dead_lettered")
                        if route["attempts"].as_u64() == Some(attempts + 1) =>
                    {
                        if late {
                            self.late_replayed += 1;
                            seen.replays += 1;
                        } else {
                            seen.dead_lettered += 1;
                        }
                    }
                    _ => self.violations.push(format!(
                        "{id}: {what} (attempts {attempts}, late {late}) answered 200 {route}"
                    )),
                }
            }
            Err((409, problem))
                if LEASE_LOST.contains(&problem["code"].as_str().unwrap_or_default()) =>
            {
                self.conflicts += 1;
                if late {
                    self.late_refused += 1;
                }
                if in_time {
                    self.violations.push(format!(
                        "{id}: an in-time {what} commit was refused: {problem}"
                    ));
                }
            }
            Err((status, problem)) => self
                .violations
                .push(format!("{id}: {what} commit answered {status} {problem}")),
        }
    }
}

/// Per-replica args for the load test.
fn replica_args(url: &str) -> Vec<String> {
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

async fn worker(
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
        let (status, body) = post(&client, &format!("{base}/v1/claims"), &request).await;
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
        // "Settle" on the rail: slow enough that some leases run out meanwhile.
        tokio::time::sleep(Duration::from_millis(rng.below(SLOWEST_COMMIT_MS + 1))).await;
        let outcomes: Vec<Value> = claims.iter().map(outcome_for).collect();
        let sent_ms = unix_ms();
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
            let back_ms = unix_ms();
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
                tally.judge(claim, outcome, answer, sent_ms, back_ms);
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
            let back_ms = unix_ms();
            let answer = if status == 200 {
                Ok(&body)
            } else {
                Err((status, &body))
            };
            tally.judge(claim, outcome, answer, sent_ms, back_ms);
        }
    }
    tally
}

/// Enqueue every receipt in batches, round-robin over the replicas.
async fn produce(client: reqwest::Client, bases: Vec<String>) -> usize {
    let mut created = 0;
    for (n, start) in (0..RECEIPTS).step_by(ENQUEUE_BATCH).enumerate() {
        let receipts: Vec<Value> = (start..(start + ENQUEUE_BATCH).min(RECEIPTS))
            .map(|i| {
                json!({"receipt_id": receipt_id(i), "finalized_at": 1_764_460_800 + i as u64,
                "observation": {"amount_cents": 100 + i}})
            })
            .collect();
        let base = &bases[n % bases.len()];
        let (status, body) = post(
            &client,
            &format!("{base}/v1/receipts/batch"),
            &json!({"receipts": receipts}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        for result in body["results"].as_array().expect("results") {
            assert_eq!(result["status"], "created", "{result}");
            created += 1;
        }
        // Producers trickle work in while the workers run.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    created
}

async fn store_bindings(client: &reqwest::Client, replicas: &[Server]) -> Vec<String> {
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
async fn check_receipt(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_settle_every_receipt_once_under_racing_workers() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = replica_args(&url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replicas = start_replicas(dir.path(), REPLICAS, &args).await;
    let client = client();
    let bindings = store_bindings(&client, &replicas).await;
    assert!(
        bindings.iter().all(|b| *b == bindings[0]),
        "replicas disagree on the store binding: {bindings:?}"
    );

    let started = Instant::now();
    let deadline = started + WORKLOAD_BOUND;
    let produced = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for k in 0..WORKERS_PER_REPLICA {
            workers.push(tokio::spawn(worker(
                client.clone(),
                replica.base.clone(),
                format!("w-{r}-{k}"),
                k % 2 == 1,
                produced.clone(),
                deadline,
            )));
        }
    }
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let enqueued = produce(client.clone(), bases.clone()).await;
    produced.store(true, Ordering::SeqCst);
    let mut tally = Tally::default();
    for task in workers {
        tally.merge(task.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < WORKLOAD_BOUND,
        "the workload did not finish in {WORKLOAD_BOUND:?}"
    );
    assert_eq!(enqueued, RECEIPTS);

    // Every replica sees the same finished queue.
    let expected_settled = (0..RECEIPTS).filter(|i| expected_end(kind(*i)).1).count() as u64;
    for base in &bases {
        let (status, view) = get(&client, &format!("{base}/v1/status?limit=1")).await;
        assert_eq!(status, 200, "{view}");
        let counts = &view["counts"];
        assert_eq!(
            counts,
            &json!({"pending": 0, "scheduled": 0, "leased": 0, "retry_scheduled": 0, "skipped": 0,
                "settled": expected_settled,
                "dead_lettered": RECEIPTS as u64 - expected_settled, "canceled": 0}),
            "status on {base}"
        );
    }

    // Every receipt, read back through the API, matches what the workers saw.
    let tally = Arc::new(tally);
    let mut readers = Vec::new();
    for part in 0..6 {
        let (client, tally, base) = (client.clone(), tally.clone(), bases[part % 3].clone());
        readers.push(tokio::spawn(async move {
            let mut problems = Vec::new();
            let mut settled = 0u64;
            for i in (part..RECEIPTS).step_by(6) {
                let id = receipt_id(i);
                match check_receipt(&client, &base, &id, tally.per_receipt.get(&id)).await {
                    Ok(true) => settled += 1,
                    Ok(false) => {}
                    Err(problem) => problems.push(problem),
                }
            }
            (settled, problems)
        }));
    }
    let mut problems = tally.violations.clone();
    let mut settled = 0;
    for reader in readers {
        let (n, found) = reader.await.expect("reader");
        settled += n;
        problems.extend(found);
    }

    // The dead letters, paged through on one replica.
    let mut letters = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url =
            reqwest::Url::parse(&format!("{}/v1/dead-letters?limit=128", bases[1])).expect("url");
        if let Some(cursor) = &after {
            url.query_pairs_mut().append_pair("after", cursor);
        }
        let (status, page) = get(&client, url.as_str()).await;
        assert_eq!(status, 200, "{page}");
        letters.extend(page["dead_letters"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    for letter in &letters {
        let id = letter["receipt_id"].as_str().expect("id");
        let kind = kind(index_of(id));
        let code = if kind == Kind::Permanent {
            "invalid_receipt_signature"
        } else {
            "rpc"
        };
        if letter["code"] != code
            || letter["attempts"].as_u64() != Some(u64::from(expected_end(kind).0))
        {
            problems.push(format!("dead letter {letter} for {kind:?}"));
        }
    }
    let dead = letters.len() as u64;
    assert_eq!(
        store_bindings(&client, &replicas).await,
        bindings,
        "binding changed"
    );
    let retried: u32 = tally.per_receipt.values().map(|s| s.retried).sum();

    println!(
        "pg_replicas: {RECEIPTS} receipts, {REPLICAS} replicas, {} workers ({} with batch claims), \
         lease {LEASE_MS} ms, commits after 0..={SLOWEST_COMMIT_MS} ms",
        REPLICAS * WORKERS_PER_REPLICA,
        REPLICAS * WORKERS_PER_REPLICA / 2
    );
    println!(
        "pg_replicas: {} claim calls ({} empty), {} receipts claimed, {} commits",
        tally.claim_calls, tally.empty_claims, tally.claimed, tally.commits
    );
    println!(
        "pg_replicas: conflicts (409 lease_conflict) {}, late commits {} (refused with 409: {}; \
         identical dead-letter replays answered with the same route: {}), deadline passed in \
         flight: {}",
        tally.conflicts, tally.late, tally.late_refused, tally.late_replayed, tally.borderline
    );
    println!(
        "pg_replicas: settled {settled}, dead-lettered {dead}, retries scheduled {retried}, \
         elapsed {:.2} s, throughput {:.0} receipts/s",
        elapsed.as_secs_f64(),
        RECEIPTS as f64 / elapsed.as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "{} problems, first ones:\n{}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(settled + dead, RECEIPTS as u64, "nothing lost");
    assert_eq!(settled, expected_settled);
    assert_eq!(
        tally.late,
        tally.late_refused + tally.late_replayed,
        "every late commit was refused (or was an identical dead-letter replay)"
    );
    assert!(
        tally.late > 0 && tally.conflicts > 0,
        "the workload raced no lease (late {}, conflicts {})",
        tally.late,
        tally.conflicts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_on_one_replica_wakes_a_long_poll_on_another() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--database-url", url.as_str(), "--pg-max-connections", "4"];
    let replicas = start_replicas(dir.path(), 2, &args).await;
    let (a, b) = (replicas[0].base.clone(), replicas[1].base.clone());
    let client = client();
    let mut latencies = Vec::new();
    for round in 0..3 {
        let poll = {
            let (client, a) = (client.clone(), a.clone());
            tokio::spawn(async move {
                let request = json!({"worker_id": "waiter", "lease_ms": 5_000, "limit": 1, "wait_ms": 10_000});
                let answer = post(&client, &format!("{a}/v1/claims"), &request).await;
                (answer, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let id = format!("wake-{round}");
        let enqueued = Instant::now();
        let (status, body) = post(
            &client,
            &format!("{b}/v1/receipts"),
            &json!({"receipt_id": id, "finalized_at": 1_764_460_800}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        let ((status, body), returned) = tokio::time::timeout(Duration::from_secs(12), poll)
            .await
            .expect("the long poll returned within its wait")
            .expect("poll task");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["claims"][0]["receipt_id"], id.as_str(), "{body}");
        let latency = returned.saturating_duration_since(enqueued);
        assert!(
            latency < Duration::from_secs(3),
            "woken {latency:?} after the enqueue on the other replica"
        );
        latencies.push(latency.as_millis());
    }
    println!(
        "pg_replicas: a long poll on replica A (wait_ms 10000) returned {latencies:?} ms after an \
         enqueue was sent to replica B (the 250 ms fallback poll alone would average ~125 ms)"
    );
}

/// The history feed (GET /v1/history) read page by page through replica B,
/// and followed live as a stream on replica A, shows every entry committed
/// through either replica exactly once, both in the same order, while
/// writers on both replicas race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_feed_of_one_replica_shows_every_commit_of_both_once() {
    let _turn = crate::turn(module_path!());
    const WRITERS: usize = 6;
    const EACH: usize = 40;
    let total = WRITERS * EACH;
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--database-url", url.as_str(), "--pg-max-connections", "6"];
    let replicas = start_replicas(dir.path(), 2, &args).await;
    let (a, b) = (replicas[0].base.clone(), replicas[1].base.clone());
    let client = client();

    // The stream outlives the 30 s bound of `client()`.
    let mut stream = reqwest::Client::new()
        .get(format!("{a}/v1/history"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status().as_u16(), 200);
    let streamed = tokio::spawn(async move {
        let mut text = String::new();
        let mut cursors = Vec::new();
        while cursors.len() < total {
            let chunk = tokio::time::timeout(Duration::from_secs(60), stream.chunk())
                .await
                .expect("stream events keep coming")
                .expect("stream")
                .expect("the stream stays open");
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                    cursors.push(id.to_owned());
                }
            }
        }
        cursors
    });

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (client, base) = (
                client.clone(),
                if w % 2 == 0 { a.clone() } else { b.clone() },
            );
            tokio::spawn(async move {
                for i in 0..EACH {
                    let id = format!("feed-{w}-{i}");
                    let receipt = json!({"receipt_id": id, "finalized_at": 1_764_460_800});
                    let (status, body) =
                        post(&client, &format!("{base}/v1/receipts"), &receipt).await;
                    assert_eq!(status, 201, "{body}");
                    let lease = json!({"worker_id": format!("w{w}"), "lease_ms": 30_000});
                    let (status, claim) =
                        post(&client, &format!("{base}/v1/receipts/{id}/claim"), &lease).await;
                    assert_eq!(status, 200, "{claim}");
                    let outcome = json!({"claim": claim,
                        "outcome": {"kind": "accepted", "transcript_id": format!("t-{id}")}});
                    let (status, body) = post(
                        &client,
                        &format!("{base}/v1/receipts/{id}/outcome"),
                        &outcome,
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                }
            })
        })
        .collect();

    // Pages through B, small ones, while the writers run.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut after = "0-0".to_owned();
    let mut paged: Vec<(String, String)> = Vec::new();
    while paged.len() < total {
        assert!(
            Instant::now() < deadline,
            "{} of {total} entries",
            paged.len()
        );
        let (status, page) = get(&client, &format!("{b}/v1/history?after={after}&limit=7")).await;
        assert_eq!(status, 200, "{page}");
        let entries = page["entries"].as_array().expect("entries");
        for entry in entries {
            paged.push((
                entry["cursor"].as_str().unwrap().to_owned(),
                entry["receipt_id"].as_str().unwrap().to_owned(),
            ));
        }
        after = page["next_cursor"].as_str().unwrap().to_owned();
        if entries.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let (status, page) = get(&client, &format!("{b}/v1/history?after={after}")).await;
    assert_eq!(
        (status, page["entries"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    let mut ids: Vec<&str> = paged.iter().map(|(_, id)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "every receipt's entry once");
    let cursors: Vec<String> = paged.into_iter().map(|(c, _)| c).collect();
    let streamed = tokio::time::timeout(Duration::from_secs(60), streamed)
        .await
        .expect("the stream got every entry")
        .expect("stream task");
    assert_eq!(
        streamed, cursors,
        "the stream on A and the pages on B agree"
    );
}
