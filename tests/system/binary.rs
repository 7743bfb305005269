//! The real `settled` binary: start-up checks, serving, graceful shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::common::process::{Launch, Server};

mod start_errors;

mod pg_schema;

mod idle_groups;

fn settled() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_settled"));
    cmd.env_remove("SETTLED_DATABASE_URL")
        .env_remove("SETTLED_LISTEN")
        .env_remove("SETTLED_TOKENS")
        .env_remove("SETTLED_PG_SCHEMA")
        .env_remove("RUST_LOG");
    cmd
}

/// Start the binary on an ephemeral port.
fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    launch(dir, "127.0.0.1:0", extra)
}

/// Start the binary with `--listen listen`, logging at its own default
/// level; its log holds the lines up to the one naming the address it
/// listens on once it is returned.
fn launch(dir: &std::path::Path, listen: &str, extra: &[&str]) -> Server {
    Launch::new(dir)
        .env_remove("SETTLED_PG_SCHEMA")
        .env_remove("RUST_LOG")
        .listen(listen)
        .args(extra)
        .spawn()
        .ready()
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test]
async fn serves_a_fresh_sqlite_database_and_stops_cleanly_on_sigterm() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &[]);
    let base = server.base.clone();
    assert!(
        dir.path().join("settled.db").exists(),
        "settled.db created in the working directory"
    );
    let client = reqwest::Client::new();
    let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let created = client
        .post(format!("{base}/v1/receipts"))
        .json(&serde_json::json!({"receipt_id": "r-1", "finalized_at": 1764460800}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    server.sigterm();
    let status = tokio::task::spawn_blocking(move || server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit 0 after SIGTERM, got {status}");

    // The receipt survived the restart.
    let server = start(dir.path(), &[]);
    let base = server.base.clone();
    let view: serde_json::Value = client
        .get(format!("{base}/v1/receipts/r-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["state"], "pending");
    let _ = server.kill();
}

#[tokio::test]
async fn a_sigterm_during_a_long_poll_answers_it_and_exits() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &[]);
    let base = server.base.clone();
    let client = reqwest::Client::new();
    let poll = tokio::spawn(async move {
        client
            .post(format!("{base}/v1/claims"))
            .json(&serde_json::json!({"worker_id": "w", "lease_ms": 1000, "limit": 1, "wait_ms": 20000}))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    server.sigterm();
    let response = poll
        .await
        .unwrap()
        .expect("the waiting claim is answered, not cut");
    assert_eq!(response.status().as_u16(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["claims"], serde_json::json!([]));
    let status = tokio::task::spawn_blocking(move || server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown did not wait out the 20 s poll"
    );
}

fn refuses(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = settled()
        .current_dir(dir.path())
        .args(args)
        .output()
        .expect("run settled");
    assert!(!out.status.success(), "{args:?} should be refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {stderr}"
    );
    assert!(
        !dir.path().join("settled.db").exists(),
        "nothing created when refused"
    );
}

#[test]
fn an_invalid_retry_policy_is_refused_naming_the_rule() {
    let _turn = crate::turn(module_path!());
    refuses(&["--max-retries", "33"], "max_retries must be 0..=32");
    refuses(
        &["--initial-backoff-ms", "0"],
        "initial_backoff_ms must be 1..=backoff_cap_ms",
    );
    refuses(
        &["--backoff-multiplier", "17"],
        "backoff_multiplier must be 1..=16",
    );
    refuses(
        &["--backoff-cap-ms", "86400001"],
        "backoff_cap_ms must be 1..=86400000",
    );
}

#[test]
fn anonymous_service_refuses_non_loopback_addresses_and_unknown_schemes() {
    let _turn = crate::turn(module_path!());
    refuses(&["--listen", "0.0.0.0:0"], "loopback");
    refuses(
        &["--database-url", "mysql://x"],
        "unknown database URL scheme",
    );
    refuses(
        &["--token", "admin:0123456789abcdef"],
        "unknown role `admin`",
    );
    refuses(&["--token", "worker:short"], "16..=256");
    // Options before the sub-command would be ignored by `serve`: refuse them.
    refuses(&["--max-retries", "99", "serve"], "cannot be used with");
}

#[tokio::test]
async fn with_tokens_it_listens_anywhere_and_requires_them() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut child = settled()
        .current_dir(dir.path())
        .env(
            "SETTLED_TOKENS",
            "worker:worker-secret-0123456789,operator:operator-secret-0123",
        )
        .env("SETTLED_LISTEN", "0.0.0.0:0")
        // As the Docker image runs it: configuration from the environment, then `serve`.
        .args(["serve", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut port = None;
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
        lines.push(line.clone());
        if let Some(address) = entry["fields"]["address"].as_str() {
            port = address.rsplit(':').next().map(str::to_owned);
            break;
        }
    }
    let base = format!("http://127.0.0.1:{}", port.expect("listening"));
    let client = reqwest::Client::new();
    let none = client.get(format!("{base}/v1/info")).send().await.unwrap();
    assert_eq!(none.status().as_u16(), 401);
    let ok = client
        .get(format!("{base}/v1/info"))
        .bearer_auth("worker-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        lines.iter().all(|l| !l.contains("secret")),
        "tokens are never logged"
    );
}

#[test]
fn openapi_subcommand_prints_the_committed_document() {
    let _turn = crate::turn(module_path!());
    let out = settled().arg("openapi").output().unwrap();
    assert!(out.status.success());
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), committed);
}

/// Out of file descriptors (a low `ulimit -n` and many sockets that send
/// nothing), the binary does not stop serving: a failed `accept` closes the
/// connection idle longest and backs off instead of spinning, so /healthz and
/// real requests still get in, and the log is not flooded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_it_keeps_serving_and_does_not_spin() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_settled"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .env_remove("SETTLED_DATABASE_URL")
        .env_remove("SETTLED_LISTEN")
        .env_remove("SETTLED_TOKENS")
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn settled");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut address = None;
    for line in lines.by_ref() {
        let entry: serde_json::Value = serde_json::from_str(&line.expect("line")).expect("json");
        if let Some(a) = entry["fields"]["address"].as_str() {
            address = Some(a.to_owned());
            break;
        }
    }
    let address: std::net::SocketAddr = address.expect("listening").parse().unwrap();
    let logs = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let started = std::time::Instant::now();
    // Far more silent sockets than the process may open files.
    let held: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(address).expect("connect"))
        .collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut refused = Vec::new();
    for i in 0..5 {
        let health = client
            .get(format!("http://{address}/healthz"))
            .send()
            .await
            .expect("/healthz served while out of file descriptors");
        assert_eq!(health.status().as_u16(), 200);
        let created = client
            .post(format!("http://{address}/v1/receipts"))
            .json(&serde_json::json!({"receipt_id": format!("fd-{i}"), "finalized_at": 1}))
            .send()
            .await
            .expect("enqueue served while out of file descriptors");
        if created.status().as_u16() != 201 {
            refused.push(created.text().await.unwrap_or_default());
        }
    }
    let took = started.elapsed();
    sigterm(&child);
    let status = child.wait().unwrap();
    let lived = started.elapsed();
    drop(held);
    assert!(status.success(), "{status:?}");
    let logs = logs.join().unwrap();
    assert!(
        refused.is_empty(),
        "enqueues refused: {refused:?}; the server logged: {:?}",
        logs.iter()
            .filter(|l| !l.contains("accept failed"))
            .collect::<Vec<_>>()
    );
    let failures = logs.iter().filter(|l| l.contains("accept failed")).count();
    // Logged at most once a second (with a count), however many fail.
    let most = 2 + lived.as_secs() as usize;
    assert!(
        failures <= most,
        "{failures} accept failures logged in {lived:?} (a hot loop?)"
    );
    println!(
        "served 10 requests in {took:?} with 300 silent sockets and 64 fds; {failures} accept failures logged"
    );
}
