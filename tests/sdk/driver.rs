//! The worker SDKs (`clients/python`, `clients/typescript`) against the real binary, on both
//! backends: `tests/sdk/scenarios.py` runs what they must show (2 000 receipts over three
//! worker processes, heartbeats of 64 leases in one request, a lost lease under a running
//! handler, SIGTERM and SIGKILL mid-batch, a server restart or a terminated PostgreSQL
//! connection, a bad token and refused parameters) with the example workers of each language.
//! And the generated parts are current: `clients/python/src/settled/_schema.py` and
//! `clients/typescript/src/schema.ts` are what `openapi.yaml` gives, the committed
//! `clients/typescript/dist/` is what `tsc` builds, and both pass their strict type checks.
//!
//! Needs `clients/python/.venv`, `clients/typescript/node_modules` and
//! `examples/node/node_modules` (`bash clients/ci-setup.sh` installs them). Without them a test
//! prints `SKIPPED: …` and passes, except when `CI` or `SETTLED_REQUIRE_SDKS` is set: there a
//! missing piece fails it. The PostgreSQL runs skip without `SETTLED_TEST_POSTGRES_URL`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{in_ci, one_at_a_time, project};

const SETUP: &str = "bash clients/ci-setup.sh";

fn python() -> PathBuf {
    project().join("clients/python/.venv/bin/python")
}

fn typescript() -> PathBuf {
    project().join("clients/typescript")
}

fn required() -> bool {
    in_ci() || std::env::var("SETTLED_REQUIRE_SDKS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Skip (or, where required, fail) when a piece is missing.
fn ready(what: &str) -> bool {
    let mut missing = Vec::new();
    if !python().exists() {
        missing.push("clients/python/.venv");
    }
    if !typescript().join("node_modules/typescript").exists() {
        missing.push("clients/typescript/node_modules");
    }
    if !project()
        .join("examples/node/node_modules/settled")
        .exists()
    {
        missing.push("examples/node/node_modules");
    }
    if missing.is_empty() {
        return true;
    }
    let reasons = missing.join(", ");
    assert!(
        !required(),
        "the {what} cannot run: missing {reasons}. Set it up with: {SETUP}"
    );
    println!("SKIPPED: {what}: missing {reasons}. Set it up with: {SETUP}");
    false
}

/// Run a command to its end, its output shown; whether it succeeded.
fn run(label: &str, command: &mut Command) -> bool {
    let status = command
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{label}: cannot start: {e}"));
    if !status.success() {
        println!("{label}: {status}");
    }
    status.success()
}

fn scenarios(lang: &str, backend: &str) {
    let _turn = one_at_a_time();
    if !ready(&format!("{lang} SDK scenarios on {backend}")) {
        return;
    }
    let mut command = Command::new(python());
    command
        .arg(project().join("tests/sdk/scenarios.py"))
        .args(["--lang", lang, "--backend", backend])
        .env("SETTLED_BIN", env!("CARGO_BIN_EXE_settled"))
        .current_dir(project());
    if backend == "postgres" {
        let Ok(url) = std::env::var("SETTLED_TEST_POSTGRES_URL") else {
            println!(
                "SKIPPED: {lang} SDK scenarios on PostgreSQL: SETTLED_TEST_POSTGRES_URL is not set"
            );
            return;
        };
        command.env("SETTLED_TEST_POSTGRES_URL", url);
        // The failover scenario runs on the HA cluster .ci/run brings up (tests/ha/cluster.sh).
        if let Ok(ha) = std::env::var("SETTLED_TEST_HA_URL") {
            command.env("SETTLED_TEST_HA_URL", ha);
        }
    }
    assert!(
        run(&format!("{lang} SDK on {backend}"), &mut command),
        "the {lang} SDK scenarios failed on {backend} (their output is above)"
    );
}

#[test]
fn the_python_sdk_keeps_the_worker_rules_on_sqlite() {
    scenarios("python", "sqlite");
}

#[test]
fn the_python_sdk_keeps_the_worker_rules_on_postgres() {
    scenarios("python", "postgres");
}

#[test]
fn the_typescript_sdk_keeps_the_worker_rules_on_sqlite() {
    scenarios("node", "sqlite");
}

#[test]
fn the_typescript_sdk_keeps_the_worker_rules_on_postgres() {
    scenarios("node", "postgres");
}

/// What must never strand a receipt (tests/sdk/robustness.py, tests/sdk/robustness.mjs): hooks
/// that raise or return nothing, codes and transcripts the server refuses, answers that are not
/// JSON, 500s, an abort with a claim in flight, Ctrl-C on an idle worker. SQLite only: what is
/// tested is the SDK's side, the same whatever the backend.
fn robustness(lang: &str) {
    let _turn = one_at_a_time();
    if !ready(&format!("{lang} SDK robustness tests")) {
        return;
    }
    let mut command = match lang {
        "python" => {
            let mut c = Command::new(python());
            c.arg(project().join("tests/sdk/robustness.py"));
            c
        }
        _ => {
            let mut c = Command::new("node");
            c.arg(project().join("tests/sdk/robustness.mjs"));
            c
        }
    };
    command
        .env("SETTLED_BIN", env!("CARGO_BIN_EXE_settled"))
        .current_dir(project());
    assert!(
        run(&format!("{lang} SDK robustness"), &mut command),
        "the {lang} SDK strands a receipt or dies on a fault (its output is above)"
    );
}

#[test]
fn the_python_sdk_never_strands_a_receipt() {
    robustness("python");
}

#[test]
fn the_typescript_sdk_never_strands_a_receipt() {
    robustness("node");
}

/// The SDKs run each handler inside a span that continues the producer's
/// trace (tests/sdk/traces.py, tests/sdk/traces.mjs).
fn traces(lang: &str) {
    let _turn = one_at_a_time();
    if !ready(&format!("{lang} SDK trace test")) {
        return;
    }
    let mut command = match lang {
        "python" => {
            let mut c = Command::new(python());
            c.arg(project().join("tests/sdk/traces.py"));
            c
        }
        _ => {
            let mut c = Command::new("node");
            c.arg(project().join("tests/sdk/traces.mjs"));
            c
        }
    };
    command
        .env("SETTLED_BIN", env!("CARGO_BIN_EXE_settled"))
        .current_dir(project());
    assert!(
        run(&format!("{lang} SDK traces"), &mut command),
        "the {lang} SDK does not continue the producer's trace (its output is above)"
    );
}

#[test]
fn the_python_sdk_continues_the_producers_trace() {
    traces("python");
}

#[test]
fn the_typescript_sdk_continues_the_producers_trace() {
    traces("node");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir`, by its path relative to it.
fn files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under dir").to_path_buf();
                out.push((relative, read(&path)));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_sdks_generated_and_built_files_are_current_and_type_check() {
    let _turn = one_at_a_time();
    if !ready("SDK drift and type checks") {
        return;
    }
    let regenerate = "regenerate: `python clients/python/generate.py`, \
        `npm run generate --prefix clients/typescript`, `npm run build --prefix clients/typescript`";
    assert!(
        run(
            "python generate.py --check",
            Command::new(python())
                .arg(project().join("clients/python/generate.py"))
                .arg("--check")
        ),
        "clients/python/src/settled/_schema.py is not what openapi.yaml gives: {regenerate}"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let schema = tmp.path().join("schema.ts");
    assert!(run(
        "openapi-typescript",
        Command::new(typescript().join("node_modules/.bin/openapi-typescript"))
            .arg(project().join("openapi.yaml"))
            .arg("--output")
            .arg(&schema)
            .current_dir(typescript())
            .stdout(Stdio::null())
    ));
    assert!(
        read(&schema) == read(&typescript().join("src/schema.ts")),
        "clients/typescript/src/schema.ts is not what openapi.yaml gives: {regenerate}"
    );
    let built = tmp.path().join("dist");
    assert!(
        run(
            "tsc --strict",
            Command::new(typescript().join("node_modules/.bin/tsc"))
                .args(["-p", "tsconfig.json", "--outDir"])
                .arg(&built)
                .current_dir(typescript())
        ),
        "the TypeScript SDK does not type-check under --strict"
    );
    assert!(
        files(&built) == files(&typescript().join("dist")),
        "clients/typescript/dist/ is not what its sources build: {regenerate}"
    );
    assert!(
        run(
            "mypy --strict",
            Command::new(python())
                .args(["-m", "mypy", "--strict", "--cache-dir"])
                .arg(tmp.path().join("mypy"))
                .arg(project().join("clients/python/src/settled"))
        ),
        "the Python SDK does not type-check under mypy --strict"
    );
}
