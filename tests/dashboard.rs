//! Tests that drive the real binary with npm and Python tooling, each pinned and installed by a
//! setup script that .ci/run calls.
//!
//! The operator dashboard in a real browser: starts the real binary with an operator token (named
//! `alice`) and a reader token, seeds receipts in every interesting state through the API, then
//! runs `node tests/dashboard/dashboard.test.mjs` (playwright-core driving headless Debian
//! Chromium): each view against the API's answers, the overview and an open receipt page
//! following the outcome feed live (outcomes the script makes through the API, with polling
//! slowed to 10 minutes), actions through their dry runs, a reader token without actions, no
//! request to another host, no horizontal overflow; then, on a second server started with
//! `--max-streams 0`, the page polling when its stream is refused (429). Afterwards the store
//! must hold what the browser did.
//! Needs `node`, `/usr/bin/chromium` and `tests/dashboard/node_modules`
//! (`bash tests/dashboard/ci-setup.sh` installs the last two).
//!
//! Generated clients: see `tests/clients/driver.rs`. The worker SDKs: see `tests/sdk/driver.rs`.
//!
//! Without its tools a test prints `SKIPPED: …` and passes, except when `CI` is set: there a
//! missing piece fails it.

#[path = "clients/driver.rs"]
mod clients;
#[path = "sdk/driver.rs"]
mod sdk;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TOKEN: &str = "operator-dashboard-token-0123456789";
const READER_TOKEN: &str = "reader-dashboard-token-0123456789";
/// Dead letters seeded for paging and for the bulk redrive (`bulk-01` … `bulk-12`).
const BULK: usize = 12;
const CHROMIUM: &str = "/usr/bin/chromium";
const SETUP: &str = "bash tests/dashboard/ci-setup.sh   (or: apt-get install -y chromium && npm ci --prefix tests/dashboard)";
const NODE_TIMEOUT: Duration = Duration::from_secs(300);

fn project() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// What this test needs that the machine lacks, each with its reason.
fn missing_pieces() -> Vec<String> {
    let mut missing = Vec::new();
    let node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !node.is_ok_and(|s| s.success()) {
        missing.push("`node` is not on PATH".to_owned());
    }
    if !Path::new(CHROMIUM).exists() {
        missing.push(format!("{CHROMIUM} is missing"));
    }
    let module = project().join("tests/dashboard/node_modules/playwright-core/package.json");
    if !module.exists() {
        missing.push("tests/dashboard/node_modules is missing (playwright-core)".to_owned());
    }
    missing
}

/// The server process; killed when dropped, even when the test panics.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the binary in `dir` with these `ROLE:TOKEN` entries.
fn start(dir: &Path, tokens: &[String], extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_settled"))
        .env_remove("SETTLED_DATABASE_URL")
        .env_remove("SETTLED_LISTEN")
        .env_remove("SETTLED_TOKENS")
        .current_dir(dir)
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(tokens.iter().flat_map(|t| ["--token", t.as_str()]))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn settled");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.expect("log line");
        let entry: Value = serde_json::from_str(&line).expect("json log line");
        if let Some(address) = entry["fields"]["address"].as_str() {
            let base = format!("http://{address}");
            // Keep draining the log so the server never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return Server { child, base };
        }
    }
    let _ = child.kill();
    let status = child.wait();
    panic!("settled exited without listening: {status:?}");
}

struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let request = match body {
            Some(body) => self.client.post(url).json(&body),
            None => self.client.get(url),
        };
        let response = request.bearer_auth(TOKEN).send().await.expect("request");
        let status = response.status().as_u16();
        let value = response.json().await.unwrap_or(Value::Null);
        (status, value)
    }

    async fn expect(&self, path: &str, body: Option<Value>, status: u16) -> Value {
        let (got, value) = self.call(path, body).await;
        assert_eq!(got, status, "{path}: {value}");
        value
    }

    async fn enqueue(&self, id: &str, finalized_at: u64) {
        let body =
            json!({"receipt_id": id, "finalized_at": finalized_at, "observation": {"amount": 42}});
        self.expect("/v1/receipts", Some(body), 201).await;
    }

    async fn claim(&self, id: &str, lease_ms: u64) -> Value {
        let body = json!({"worker_id": "dashboard-worker", "lease_ms": lease_ms});
        self.expect(&format!("/v1/receipts/{id}/claim"), Some(body), 200)
            .await
    }

    async fn outcome(&self, claim: &Value, outcome: Value) -> Value {
        let id = claim["receipt_id"].as_str().expect("receipt_id");
        let body = json!({"claim": claim, "outcome": outcome});
        self.expect(&format!("/v1/receipts/{id}/outcome"), Some(body), 200)
            .await
    }
}

/// Some pending (one of them scheduled for tomorrow, one with numbers beyond a double), one leased, two retrying (one with
/// the rail's `retry_after_ms`), one settled,
/// two dead-lettered (`invalid_receipt_signature`) and `BULK` more (`invalid_action_hash`).
async fn seed(api: &Api) {
    for (i, id) in ["pending-1", "pending-2", "pending-3"].iter().enumerate() {
        api.enqueue(id, 1_764_460_800 + i as u64).await;
    }
    let tomorrow = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
        + 86_400_000;
    let body = json!({"receipt_id": "scheduled-1", "finalized_at": 1_764_460_805, "visible_at_ms": tomorrow});
    api.expect("/v1/receipts", Some(body), 201).await;
    // Numbers JavaScript's JSON.parse would round: the receipt page shows them as stored.
    let precise: Value = serde_json::from_str(
        r#"{"receipt_id": "precise-1", "finalized_at": 1764460806,
            "observation": {"amount_minor": 123456789012345678901, "rate": 0.1000000000000000055511151231257827}}"#,
    )
    .expect("precise-1 JSON");
    api.expect("/v1/receipts", Some(precise), 201).await;
    api.enqueue("leased-1", 1_764_460_810).await;
    api.claim("leased-1", 3_600_000).await;
    api.enqueue("settled-1", 1_764_460_820).await;
    let claim = api.claim("settled-1", 60_000).await;
    let route = api
        .outcome(
            &claim,
            json!({"kind": "accepted", "transcript_id": "tx-dashboard-1"}),
        )
        .await;
    assert_eq!(route["kind"], "no_action", "accepted: {route}");
    for (id, at) in [("dead-1", 1_764_460_830), ("dead-2", 1_764_460_840)] {
        api.enqueue(id, at).await;
        let claim = api.claim(id, 60_000).await;
        let outcome = json!({"kind": "permanent", "code": "invalid_receipt_signature", "detail": "seeded by tests/dashboard.rs"});
        let route = api.outcome(&claim, outcome).await;
        assert_eq!(route["kind"], "dead_lettered", "{id}: {route}");
    }
    for i in 1..=BULK {
        let id = format!("bulk-{i:02}");
        api.enqueue(&id, 1_764_460_900 + i as u64).await;
        let claim = api.claim(&id, 60_000).await;
        let outcome = json!({"kind": "permanent", "code": "invalid_action_hash", "detail": format!("bulk seed {i}")});
        let route = api.outcome(&claim, outcome).await;
        assert_eq!(route["kind"], "dead_lettered", "{id}: {route}");
    }
    api.enqueue("retry-1", 1_764_460_850).await;
    let claim = api.claim("retry-1", 60_000).await;
    let outcome = json!({"kind": "retryable", "code": "rpc", "detail": "rail timed out"});
    let route = api.outcome(&claim, outcome).await;
    assert_eq!(route["kind"], "retry_scheduled", "retry-1: {route}");
    // The rail's own wait, recorded in the history entry.
    api.enqueue("retry-2", 1_764_460_860).await;
    let claim = api.claim("retry-2", 60_000).await;
    let outcome = json!({"kind": "retryable", "code": "rpc", "detail": "rail asked for 5 s", "retry_after_ms": 5000});
    let route = api.outcome(&claim, outcome).await;
    assert_eq!(route["kind"], "retry_scheduled", "retry-2: {route}");
    let status = api.expect("/v1/status?limit=1", None, 200).await;
    assert_eq!(
        status["counts"],
        json!({"pending": 5, "scheduled": 1, "held": 0, "leased": 1, "retry_scheduled": 2, "settled": 1, "skipped": 0, "dead_lettered": 2 + BULK, "canceled": 0}),
        "seeded counts"
    );
}

/// Wait for `child` to exit; after `limit` kill it and answer `None`.
fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child process") {
            return Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run the browser test, echoing its output, and return whether it exited 0.
fn run_node(base: &str, streamless_base: &str) -> bool {
    let mut child = Command::new("node")
        .arg("tests/dashboard/dashboard.test.mjs")
        .current_dir(project())
        .env("BASE", base)
        .env("STREAMLESS_BASE", streamless_base)
        .env("TOKEN", TOKEN)
        .env("READER_TOKEN", READER_TOKEN)
        .env("REDRIVE_ID", "dead-2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = wait_or_kill(&mut child, NODE_TIMEOUT);
    println!("--- node tests/dashboard/dashboard.test.mjs: stdout ---");
    print!("{}", out.join().unwrap_or_default());
    println!("--- stderr ---");
    print!("{}", err.join().unwrap_or_default());
    println!("--- exit: {status:?} ---");
    match status {
        Some(status) => status.success(),
        None => {
            println!("node did not finish within {NODE_TIMEOUT:?} and was killed");
            false
        }
    }
}

/// The tests of this binary (a browser, two client generators and `tsc`)
/// each load the machine on their own: they run one at a time, so that
/// none starves another's start-up (Chromium's start took over 30 s beside
/// them on a loaded machine).
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// [`TURN`] for a test that is not async.
fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.blocking_lock()
}

#[tokio::test]
async fn the_dashboard_shows_the_api_and_redrives_in_a_real_browser() {
    let _turn = TURN.lock().await;
    let missing = missing_pieces();
    if !missing.is_empty() {
        let reasons = missing.join("; ");
        assert!(
            !in_ci(),
            "CI is set and the dashboard test cannot run: {reasons}. Set it up with: {SETUP}"
        );
        println!("SKIPPED: dashboard browser test: {reasons}. Set it up with: {SETUP}");
        return;
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = [
        format!("operator:alice:{TOKEN}"),
        format!("reader:{READER_TOKEN}"),
    ];
    let server = start(dir.path(), &tokens, &[]);
    // A second server that refuses every event stream (429): the page must poll there.
    let streamless_dir = tempfile::tempdir().expect("tempdir");
    let streamless = start(streamless_dir.path(), &tokens, &["--max-streams", "0"]);
    let api = Api {
        client: reqwest::Client::new(),
        base: server.base.clone(),
    };
    seed(&api).await;

    let base = server.base.clone();
    let streamless_base = streamless.base.clone();
    let passed = tokio::task::spawn_blocking(move || run_node(&base, &streamless_base))
        .await
        .expect("node runner");
    assert!(
        passed,
        "the dashboard browser test failed (its output is above)"
    );

    // The redrive the browser made is in the store.
    let redriven = api.expect("/v1/receipts/dead-2", None, 200).await;
    assert_eq!(redriven["state"], "pending");
    assert_eq!(redriven["attempts"], 0);
    // So are the bulk redrive and the cancel.
    for i in 1..=BULK {
        let receipt = api
            .expect(&format!("/v1/receipts/bulk-{i:02}"), None, 200)
            .await;
        assert_eq!(receipt["state"], "pending", "bulk-{i:02}");
    }
    let canceled = api.expect("/v1/receipts/pending-3", None, 200).await;
    assert_eq!(canceled["state"], "canceled");
    drop(server);
}
