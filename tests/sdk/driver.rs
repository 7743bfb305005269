//! The worker SDKs (`clients/python`, `clients/typescript`) against the real binary, on both
//! backends: `tests/sdk/scenarios.py` runs what they must show (2 000 receipts over three
//! worker processes, heartbeats of 64 leases in one request, a lost lease under a running
//! handler, SIGTERM and SIGKILL mid-batch, a server restart or a terminated PostgreSQL
//! connection, a bad token and refused parameters) with the example workers of each language.
//! And the generated parts are current: `clients/python/src/settled/_schema.py` and
//! `clients/typescript/src/schema.ts` are what `openapi.yaml` gives, the committed
//! `clients/typescript/dist/` is what `tsc` builds, and both pass their strict type checks.
//!
//! The Java SDK (`clients/java`) runs the same scenarios with its example worker's jar, and its
//! unit tests (which compare its types with `openapi.yaml`) through `clients/java/build.sh`;
//! those need Java 17, Maven and Debian's junit5 and libjackson2-databind-java packages.
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

const JAVA_SETUP: &str = "apt-get install openjdk-17-jdk maven junit5 libjackson2-databind-java, \
    then bash clients/java/build.sh";

/// What the Java SDK's build needs: Java 17 or newer, Maven, and Debian's JUnit 5 and Jackson.
fn java_missing() -> Vec<&'static str> {
    let mut missing = Vec::new();
    let javac = Command::new("javac").arg("-version").output().map(|o| {
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
    });
    let version = javac.ok().and_then(|v| {
        v.split_whitespace()
            .nth(1)
            .and_then(|n| n.split('.').next()?.parse::<u32>().ok())
    });
    if version.is_none_or(|v| v < 17) {
        missing.push("a Java 17 JDK (javac)");
    }
    if Command::new("mvn")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        missing.push("maven");
    }
    for (jar, package) in [
        ("junit-platform-console-standalone.jar", "junit5"),
        ("jackson-databind.jar", "libjackson2-databind-java"),
    ] {
        if !Path::new("/usr/share/java").join(jar).exists() {
            missing.push(package);
        }
    }
    missing
}

/// Skip (or, where required, fail) when the Java SDK cannot be built or has not been.
fn java_ready(what: &str, built: bool) -> bool {
    let mut missing = java_missing();
    let jar = "examples/java/target/settled-example-worker.jar";
    if built && missing.is_empty() && !project().join(jar).exists() {
        missing.push(jar);
    }
    if missing.is_empty() {
        return true;
    }
    let reasons = missing.join(", ");
    assert!(
        !required(),
        "the {what} cannot run: missing {reasons}. Set it up with: {JAVA_SETUP}"
    );
    println!("SKIPPED: {what}: missing {reasons}. Set it up with: {JAVA_SETUP}");
    false
}

fn scenarios(lang: &str, backend: &str) {
    let _turn = one_at_a_time();
    if !ready(&format!("{lang} SDK scenarios on {backend}")) {
        return;
    }
    if lang == "java" && !java_ready(&format!("java SDK scenarios on {backend}"), true) {
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

#[test]
fn the_java_sdk_keeps_the_worker_rules_on_sqlite() {
    scenarios("java", "sqlite");
}

#[test]
fn the_java_sdk_keeps_the_worker_rules_on_postgres() {
    scenarios("java", "postgres");
}

/// The Java SDK builds offline from Debian's packages and passes its unit tests, among them the
/// comparison of its records and enums with `openapi.yaml`'s schemas (`clients/java/build.sh`,
/// which also builds the example worker's jar the scenarios run).
#[test]
fn the_java_sdk_builds_and_its_types_follow_the_spec() {
    let _turn = one_at_a_time();
    if !java_ready("Java SDK build, unit and drift tests", false) {
        return;
    }
    assert!(
        run(
            "clients/java/build.sh",
            Command::new("bash")
                .arg(project().join("clients/java/build.sh"))
                .current_dir(project())
        ),
        "the Java SDK does not build, or its unit tests fail (a type no longer follows openapi.yaml?): \
         its output is above"
    );
}

/// Run `tests/sdk/{script}.py` (Python) or `tests/sdk/{script}.mjs` (TypeScript) against the
/// built binary; `failure` says what its failing means.
fn sdk_script(lang: &str, script: &str, failure: &str) {
    let _turn = one_at_a_time();
    if !ready(&format!("{lang} SDK {script} test")) {
        return;
    }
    let mut command = match lang {
        "python" => {
            let mut c = Command::new(python());
            c.arg(project().join(format!("tests/sdk/{script}.py")));
            c
        }
        _ => {
            let mut c = Command::new("node");
            c.arg(project().join(format!("tests/sdk/{script}.mjs")));
            c
        }
    };
    command
        .env("SETTLED_BIN", env!("CARGO_BIN_EXE_settled"))
        .current_dir(project());
    assert!(
        run(&format!("{lang} SDK {script}"), &mut command),
        "the {lang} SDK {failure} (its output is above)"
    );
}

/// What must never strand a receipt (tests/sdk/robustness.py, tests/sdk/robustness.mjs): hooks
/// that raise or return nothing, codes and transcripts the server refuses, answers that are not
/// JSON, 500s, an abort with a claim in flight, Ctrl-C on an idle worker. SQLite only: what is
/// tested is the SDK's side, the same whatever the backend.
const STRANDS: &str = "strands a receipt or dies on a fault";

#[test]
fn the_python_sdk_never_strands_a_receipt() {
    sdk_script("python", "robustness", STRANDS);
}

#[test]
fn the_typescript_sdk_never_strands_a_receipt() {
    sdk_script("node", "robustness", STRANDS);
}

/// The SDKs run each handler inside a span that continues the producer's
/// trace (tests/sdk/traces.py, tests/sdk/traces.mjs).
const NO_TRACE: &str = "does not continue the producer's trace";

#[test]
fn the_python_sdk_continues_the_producers_trace() {
    sdk_script("python", "traces", NO_TRACE);
}

#[test]
fn the_typescript_sdk_continues_the_producers_trace() {
    sdk_script("node", "traces", NO_TRACE);
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
