//! The polyglot examples run against the real binary: the Python worker, the
//! Node.js worker (each as three concurrent processes with injected rail
//! failures and slow settlements) and the curl operator walkthrough. Each runs
//! against a server of its own, and the end state is checked through the API:
//! every receipt finished (settled, skipped or dead-lettered), each settled
//! receipt accepted exactly once, and the counts agree with `/v1/status`.
//!
//! The workers run on the SDKs (`bash clients/ci-setup.sh` installs them).
//! An example whose interpreter (`python3`, `node` 18+, `bash`, `curl`, `jq`)
//! or SDK is missing is skipped with a message saying so. Run with `--nocapture` to
//! see how long each example took.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::process::{self, Launch};

const WORKER_TOKEN: &str = "worker-token-0123456789abcdef";
const OPERATOR_TOKEN: &str = "operator-token-0123456789abcdef";

/// Receipts enqueued for each worker example.
const RECEIPTS: usize = 300;
/// How long one example's worker phase may take before it is a failure.
const WORKERS_DEADLINE: Duration = Duration::from_secs(40);

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `Some(version text)` when `tool --version` runs.
fn tool_version(tool: &str) -> Option<String> {
    let out = Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    })
}

/// Whether every tool is installed; prints which are missing otherwise.
fn have_tools(example: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| tool_version(t).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!(
        "SKIPPED: the {example} example did not run: {} not found on PATH",
        missing.join(", ")
    );
    false
}

/// Percent-encode a receipt id for a URL path: everything but unreserved characters.
/// Whether the SDK an example runs on is installed (`bash clients/ci-setup.sh` installs
/// both); prints why not otherwise, and fails where `CI` or `SETTLED_REQUIRE_SDKS` is set.
fn sdk_installed(example: &str, path: &Path) -> bool {
    if path.exists() {
        return true;
    }
    let required = ["CI", "SETTLED_REQUIRE_SDKS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false"));
    let why = format!(
        "SKIPPED: the {example} example did not run: its SDK is not installed ({} is missing); \
         install it with: bash clients/ci-setup.sh",
        path.display()
    );
    assert!(!required, "{why}");
    eprintln!("{why}");
    false
}

fn enc(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

mod server;

use server::*;

// ---------------------------------------------------------------------------
// Running the workers

/// A worker process with its output in files (a pipe could fill and block it).
struct WorkerProcess {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

fn spawn_worker(
    server: &Server,
    program: &str,
    script: &Path,
    name: &str,
    args: &[&str],
) -> WorkerProcess {
    let stdout = server.dir.path().join(format!("{name}.out"));
    let stderr = server.dir.path().join(format!("{name}.err"));
    let child = Command::new(program)
        .arg(script)
        .args(["--worker-id", name])
        .args(args)
        .env("SETTLED_URL", &server.base)
        .env("SETTLED_TOKEN", WORKER_TOKEN)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program} {}: {e}", script.display()));
    WorkerProcess {
        name: name.to_owned(),
        child,
        stdout,
        stderr,
    }
}

impl WorkerProcess {
    /// Wait for the exit, failing the test past `deadline`.
    async fn wait(&mut self, deadline: Instant) -> ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "worker {} did not exit in time; its log:\n{}",
                    self.name,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The counters the worker prints on exit.
    fn summary(&self) -> Value {
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        out.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| {
                panic!(
                    "worker {} printed no summary; stdout: {out}\nstderr: {}",
                    self.name,
                    self.log()
                )
            })
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

fn sum(summaries: &[Value], key: &str) -> u64 {
    summaries.iter().map(|s| s[key].as_u64().unwrap_or(0)).sum()
}

/// One worker example: a SIGTERM check, then three concurrent workers with
/// injected failures settle everything; the end state is checked.
async fn worker_example(label: &str, program: &str, script: &Path) {
    let server = Server::start();
    let expected = enqueue(&server, RECEIPTS).await;

    // 1. SIGTERM mid-batch: the worker reports what it finished, releases
    //    what it had not started, and exits 0. Its 30 s leases would still be
    //    live had it not released them.
    let mut term = spawn_worker(
        &server,
        program,
        script,
        &format!("{label}-term"),
        &[
            "--batch-size",
            "40",
            "--lease-ms",
            "30000",
            "--wait-ms",
            "1000",
            "--latency-ms",
            "40",
            "--timeout-rate",
            "0",
            "--decline-rate",
            "0",
        ],
    );
    let until = Instant::now() + Duration::from_secs(15);
    while count(&server.counts().await, "leased") == 0 {
        assert!(
            Instant::now() < until,
            "{label}: the worker never claimed anything; its log:\n{}",
            term.log()
        );
        assert!(
            matches!(term.child.try_wait(), Ok(None)),
            "{label}: the worker exited early; its log:\n{}",
            term.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    sigterm(&term.child);
    let status = term.wait(Instant::now() + Duration::from_secs(15)).await;
    assert!(
        status.success(),
        "{label}: exit 0 after SIGTERM, got {status}; log:\n{}",
        term.log()
    );
    let summary = term.summary();
    let counts = server.counts().await;
    assert_eq!(
        count(&counts, "leased"),
        0,
        "{label}: every lease was reported or released on SIGTERM: {counts}; summary {summary}"
    );
    // Every claim was either recorded or released (a SIGTERM that lands while
    // a finished batch is being reported leaves nothing to release).
    let n = |key: &str| summary[key].as_u64().unwrap_or(0);
    assert_eq!(
        n("claimed"),
        n("accepted") + n("skipped") + n("released"),
        "{label}: every claim recorded or released: {summary}"
    );
    assert_eq!(n("lost"), 0, "{label}: no lease lost: {summary}");
    println!("{label}: SIGTERM mid-batch: {summary}");

    // 2. Three workers with injected failures settle everything.
    let started = Instant::now();
    let args = [
        "--batch-size",
        "16",
        "--lease-ms",
        "3000",
        "--wait-ms",
        "400",
        "--exit-when-idle",
        "3",
        "--latency-ms",
        "3",
        "--timeout-rate",
        "0.15",
        "--decline-rate",
        "0.03",
        "--slow-rate",
        "0.01",
        "--slow-ms",
        "1200",
    ];
    let mut workers: Vec<WorkerProcess> = (1..=3)
        .map(|i| spawn_worker(&server, program, script, &format!("{label}-{i}"), &args))
        .collect();
    let deadline = started + WORKERS_DEADLINE;
    // Note when the queue drains, while the workers run.
    let mut drained_after = None;
    while workers
        .iter_mut()
        .any(|w| matches!(w.child.try_wait(), Ok(None)))
    {
        if drained_after.is_none() {
            let c = server.counts().await;
            if ["pending", "leased", "retry_scheduled"]
                .iter()
                .all(|s| count(&c, s) == 0)
            {
                drained_after = Some(started.elapsed());
            }
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut summaries = Vec::new();
    for w in &mut workers {
        let status = w.wait(deadline).await;
        assert!(
            status.success(),
            "{} exited with {status}:\n{}",
            w.name,
            w.log()
        );
        summaries.push(w.summary());
    }
    let exited_after = started.elapsed();
    let drained_after = drained_after.unwrap_or(exited_after);

    let tally = check_end_state(&server, &expected).await;
    // Counters of every worker of this example, the SIGTERM one included.
    summaries.push(summary);
    // A 200 for an accepted outcome means it was recorded: had two workers both
    // been told so for one receipt, it would have been settled twice.
    let accepted_reported = sum(&summaries, "accepted");
    assert!(
        accepted_reported <= tally.get("settled").copied().unwrap_or(0),
        "{label}: {accepted_reported} accepted outcomes recorded for {tally:?}"
    );
    println!(
        "{label} example: {RECEIPTS} receipts finished in {:.2} s with 3 workers \
         (workers exited after {:.2} s, idle polls included): {tally:?}; \
         outcomes recorded by the workers: accepted {}, skipped {}, retryable {}, permanent {}; \
         heartbeats {}, leases lost {}, released {}",
        drained_after.as_secs_f64(),
        exited_after.as_secs_f64(),
        accepted_reported,
        sum(&summaries, "skipped"),
        sum(&summaries, "retryable"),
        sum(&summaries, "permanent"),
        sum(&summaries, "heartbeats"),
        sum(&summaries, "lost"),
        sum(&summaries, "released"),
    );
}

// ---------------------------------------------------------------------------
// The examples

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_worker_settles_every_receipt() {
    // The example runs on the Python SDK, installed in this virtualenv.
    let python = repo("clients/python/.venv/bin/python");
    if !sdk_installed("Python worker", &python) {
        return;
    }
    let python = python.to_string_lossy().into_owned();
    println!("python: {}", tool_version(&python).unwrap_or_default());
    worker_example("python", &python, &repo("examples/python/worker.py")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_worker_settles_every_receipt() {
    if !have_tools("Node.js worker", &["node"]) {
        return;
    }
    let version = tool_version("node").unwrap_or_default();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 18 {
        eprintln!(
            "SKIPPED: the Node.js worker example did not run: it needs Node.js 18 or later (built-in fetch), found {version}"
        );
        return;
    }
    if !sdk_installed(
        "Node.js worker",
        &repo("examples/node/node_modules/settled"),
    ) {
        return;
    }
    println!("node: {version}");
    worker_example("node", "node", &repo("examples/node/worker.mjs")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_operator_walkthrough_runs() {
    if !have_tools("curl operator", &["bash", "curl", "jq"]) {
        return;
    }
    let server = Server::start();
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(repo("examples/curl/operator.sh"))
        .env("SETTLED_URL", &server.base)
        .env("SETTLED_TOKEN", OPERATOR_TOKEN)
        .env("RUN", "test")
        .stdin(Stdio::null())
        .output()
        .expect("run operator.sh");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "operator.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("HTTP 409"), "the spent claim is refused");

    let expected = [
        ("op-test-coffee", false),
        ("op-test-refund", true),
        ("op-test/tea #1", false),
    ]
    .map(|(id, zero)| Expected {
        receipt_id: id.to_owned(),
        zero,
    });
    let tally = check_end_state(&server, &expected).await;
    assert_eq!(tally.get("settled"), Some(&2), "{tally:?}");
    assert_eq!(tally.get("skipped"), Some(&1), "{tally:?}");

    // The redriven receipt shows its whole life.
    let view = server
        .get(&format!("/v1/receipts/{}", enc("op-test/tea #1")))
        .await;
    let outcomes: Vec<&str> = view["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(|h| h["outcome"].as_str())
        .collect();
    // The walk-through's bulk hold and unhold select its group, this receipt included.
    assert_eq!(
        outcomes,
        ["permanent", "redrive", "hold", "unhold", "accepted"],
        "{view}"
    );
    assert_eq!(view["history"][0]["rail_code"], "card_declined", "{view}");
    println!(
        "curl operator example: 3 receipts enqueued, one dead-lettered, redriven and settled in {:.2} s",
        took.as_secs_f64()
    );
}
