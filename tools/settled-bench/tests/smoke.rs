//! The bench tool runs end to end on a small workload: it spawns the real
//! server, settles everything, and reports every figure with its invariants held.
//! With `--raw` it also runs the plain-SQL ceiling and reports settled's share of it;
//! with `--replicas 2` its workers use two servers on one PostgreSQL database.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// One run at a time: each spawns a server and workers, and two at once on a
/// loaded machine would only measure each other.
fn turn() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const FIELDS: [&str; 19] = [
    "settled_per_sec",
    "enqueued_per_sec",
    "claim_p50_ms",
    "claim_p99_ms",
    "outcome_p50_ms",
    "outcome_p99_ms",
    "peak_rss_mb",
    "invariants_ok",
    "inprocess_settled_per_sec",
    "http_over_inprocess",
    "backend",
    "receipts",
    "workers",
    "batch",
    "conflicts",
    "elapsed_s",
    "preload",
    "server_cpu_us_per_receipt",
    "server_written_bytes_per_receipt",
];

/// Present only with `--raw`. CPU figures may round to 0 on a tiny run
/// (the kernel counts in 10 ms ticks), so they are only required to be numbers.
const RAW_FIELDS: [&str; 4] = [
    "raw_per_sec",
    "raw_enqueued_per_sec",
    "settled_over_raw",
    "raw_cpu_us_per_row",
];

fn bench(backend: &str, receipts: &str, batch: &str, extra: &[&str]) {
    // It spawns the `settled` binary beside it, which `cargo test` at the root builds.
    let bench = std::path::Path::new(env!("CARGO_BIN_EXE_settled-bench"));
    assert!(
        bench.with_file_name("settled").exists(),
        "no settled binary beside {}: run `cargo build --bins` (or `cargo test` at the root) first",
        bench.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_settled-bench"))
        .args(["--spawn", backend, "--receipts", receipts, "--workers", "4"])
        .args(["--batch", batch, "--json", "--timeout-s", "120"])
        .args(extra)
        .output()
        .expect("run settled-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "settled-bench {backend} batch {batch} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON object on stdout ({e}): {stdout}"));
    for field in FIELDS {
        let value = &report[field];
        assert!(
            !value.is_null(),
            "field {field} missing or null in {report}"
        );
    }
    let raw = extra.contains(&"--raw");
    for field in RAW_FIELDS {
        let value = &report[field];
        if raw {
            let least = if field.contains("cpu") {
                0.0
            } else {
                f64::MIN_POSITIVE
            };
            assert!(
                value.as_f64().is_some_and(|v| v >= least),
                "field {field} missing or below {least} in {report}"
            );
        } else {
            assert!(value.is_null(), "{field} without --raw in {report}");
        }
    }
    assert_eq!(report["invariants_ok"], true, "{report}\n{stderr}");
    assert_eq!(report["backend"], backend);
    assert_eq!(report["receipts"].as_u64(), receipts.parse().ok());
    let replicas = extra
        .iter()
        .position(|a| *a == "--replicas")
        .map_or("1", |i| extra[i + 1]);
    assert_eq!(
        report["replicas"].as_u64(),
        replicas.parse().ok(),
        "{report}"
    );
}

#[test]
fn sqlite_batches() {
    let _turn = turn();
    bench("sqlite", "300", "16", &["--raw"]);
}

#[test]
fn sqlite_one_by_one() {
    let _turn = turn();
    // Spread over groups: every claim is shared out over them.
    bench("sqlite", "100", "1", &["--groups", "7"]);
}

fn postgres_url() -> Option<String> {
    let url = std::env::var("SETTLED_TEST_POSTGRES_URL").ok();
    if url.is_none() {
        eprintln!(
            "SKIPPED: SETTLED_TEST_POSTGRES_URL is not set, so the PostgreSQL bench did not run"
        );
    }
    url
}

#[test]
fn postgres_batches() {
    let _turn = turn();
    if let Some(url) = postgres_url() {
        bench("postgres", "300", "16", &["--postgres-url", &url, "--raw"]);
    }
}

#[test]
fn postgres_one_by_one() {
    let _turn = turn();
    if let Some(url) = postgres_url() {
        bench(
            "postgres",
            "100",
            "1",
            // Two replicas on the one database: workers spread over them.
            &["--postgres-url", &url, "--groups", "7", "--replicas", "2"],
        );
    }
}
