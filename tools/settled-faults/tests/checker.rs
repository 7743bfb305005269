//! The fault harness's checker, driven as a user drives it: `settled-faults
//! check FILE` on recorded runs. A clean run passes; a run with a lost
//! receipt, a receipt settled twice, a stale commit accepted, two overlapping
//! leases or an outcome missing from history is reported in its column and
//! the command exits non-zero.

use std::process::Command;

use serde_json::{Value, json};

fn op(receipt: &str, worker: &str, sent: u64, answered: u64, answer: Value, kind: Value) -> Value {
    json!({"receipt": receipt, "worker": worker, "sent_ms": sent, "answered_ms": answered,
           "answer": answer, "kind": kind})
}

fn claim(token: &str, version: u64) -> Value {
    json!({"op": "claim", "token": token, "row_version": version, "lease_ms": 1000})
}

fn accepted(token: &str) -> Value {
    json!({"op": "outcome", "token": token, "outcome": "accepted", "transcript_id": format!("tx-{token}")})
}

fn settled(worker: &str, transcript: &str) -> Value {
    json!({"state": "settled", "transcript_id": transcript,
           "history": [{"outcome": "accepted", "worker_id": worker, "transcript_id": transcript, "route": "no_action"}]})
}

/// r1: claimed by w1, extended, settled. r2: w1's lease lapses, w2 claims
/// it, w1's late commit is refused, w2's first commit loses its answer and
/// the resend is acknowledged.
fn clean() -> Value {
    let enqueue = json!({"op": "enqueue"});
    json!({
        "scenario": "clean",
        "ops": [
            op("r1", "p", 0, 5, json!("ok"), enqueue.clone()),
            op("r1", "w1", 10, 12, json!("ok"), claim("a", 1)),
            op("r1", "w1", 100, 104, json!("ok"), json!({"op": "extend", "token": "a", "extend_ms": 1000})),
            op("r1", "w1", 900, 905, json!("ok"), accepted("a")),
            op("r2", "p", 0, 5, json!("ok"), enqueue),
            op("r2", "w1", 10, 12, json!("ok"), claim("b", 1)),
            op("r2", "w2", 1100, 1102, json!("ok"), claim("c", 2)),
            op("r2", "w1", 1200, 1201, json!({"refused": "lease_conflict"}), accepted("b")),
            op("r2", "w2", 1300, 1305, json!("unknown"), accepted("c")),
            op("r2", "w2", 1310, 1315, json!({"refused": "receipt_finished"}), accepted("c")),
        ],
        "faults": [{"fault": "kill", "start_ms": 1250, "end_ms": 1290}],
        "finals": {"r1": settled("w1", "tx-a"), "r2": settled("w2", "tx-c")},
        "total_stored": 2,
        "duration_ms": 2000
    })
}

/// Run the checker on `runs`; its exit success and, per run, the table's
/// row as column name → cell.
fn check(runs: &[(&str, Value)]) -> (bool, Vec<std::collections::HashMap<String, String>>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    for (name, run) in runs {
        let mut run = run.clone();
        run["scenario"] = json!(name);
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec(&run).expect("json")).expect("write");
        files.push(path);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_settled-faults"))
        .arg("check")
        .args(&files)
        .output()
        .expect("run settled-faults");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let cells =
        |line: &str| -> Vec<String> { line.split('|').map(|c| c.trim().to_owned()).collect() };
    let header = text
        .lines()
        .find(|l| l.starts_with("| scenario | time"))
        .map(cells)
        .unwrap_or_else(|| panic!("no table in {text}"));
    let rows = runs
        .iter()
        .map(|(name, _)| {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .map(cells)
                .unwrap_or_else(|| panic!("no row for {name} in {text}"));
            header.iter().cloned().zip(row).collect()
        })
        .collect();
    (out.status.success(), rows)
}

#[test]
fn a_clean_recording_passes() {
    let (ok, rows) = check(&[("clean", clean())]);
    assert!(ok, "{rows:?}");
    for column in [
        "lost",
        "settled twice",
        "stale commits accepted",
        "overlapping leases",
        "outcomes missing from history",
        "history contradicting state",
    ] {
        assert_eq!(rows[0][column], "0", "{column}: {rows:?}");
    }
    assert_eq!(rows[0]["acknowledged"], "7");
}

#[test]
fn each_defect_is_reported_in_its_column_and_fails_the_run() {
    let mut lost = clean();
    lost["finals"]["r1"] = Value::Null;
    lost["total_stored"] = json!(1);

    let mut twice = clean();
    twice["finals"]["r2"]["history"]
        .as_array_mut()
        .expect("history")
        .insert(0, json!({"outcome": "accepted", "worker_id": "w1", "transcript_id": "tx-b", "route": "no_action"}));

    // w1's commit under claim b, sent after w2's claim c was answered, acknowledged.
    let mut stale = clean();
    stale["ops"][7]["answer"] = json!("ok");

    // w2's claim answered at 500 ms while w1's lease (sent at 10, 1000 ms) was surely live.
    let mut overlap = clean();
    overlap["ops"][6]["sent_ms"] = json!(498);
    overlap["ops"][6]["answered_ms"] = json!(500);

    let mut missing = clean();
    missing["finals"]["r1"]["history"] = json!([]);
    missing["finals"]["r1"]["state"] = json!("settled");

    let cases = [
        ("lost", lost, "lost"),
        ("twice", twice, "settled twice"),
        ("stale", stale, "stale commits accepted"),
        ("overlap", overlap, "overlapping leases"),
        ("missing", missing, "outcomes missing from history"),
    ];
    for (name, run, column) in &cases {
        let (ok, rows) = check(&[(name, run.clone())]);
        assert!(!ok, "{name}: the check passed: {rows:?}");
        assert_ne!(rows[0][*column], "0", "{name}: {rows:?}");
    }
    // All at once: one row each, and a failure.
    let all: Vec<(&str, Value)> = cases.iter().map(|(n, r, _)| (*n, r.clone())).collect();
    let (ok, rows) = check(&all);
    assert!(!ok);
    assert_eq!(rows.len(), 5);
}
