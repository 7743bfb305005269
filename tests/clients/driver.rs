//! Clients generated from the committed `openapi.yaml` run a small flow each against the real
//! binary with tokens: TypeScript (openapi-typescript types, openapi-fetch, checked with
//! `tsc --noEmit`) runs `tests/clients/flow.ts`, Python (openapi-python-client) runs
//! `tests/clients/flow.py`. The code is generated into `tests/clients/generated/` (ignored).
//!
//! Needs `node` and `tests/clients/node_modules`, or `tests/clients/.venv` for Python
//! (`bash tests/clients/ci-setup.sh` installs both, pinned). Without them a test prints
//! `SKIPPED: …` and passes, except when `CI` is set: there a missing piece fails it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Server, in_ci, project, start};

const SETUP: &str = "bash tests/clients/ci-setup.sh";
/// Generous: each step is a few seconds on an idle machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);
const TOKENS: [(&str, &str); 3] = [
    ("producer", "producer-clients-token-0123456789"),
    ("worker", "worker-clients-token-0123456789"),
    ("operator", "operator-clients-token-0123456789"),
];

fn clients_dir() -> PathBuf {
    project().join("tests/clients")
}

/// Skip (or, in CI, fail) when something is missing.
fn ready(language: &str, needs: &[(&str, bool)]) -> bool {
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(_, present)| !present)
        .map(|(what, _)| *what)
        .collect();
    if missing.is_empty() {
        return true;
    }
    let reasons = missing.join("; ");
    assert!(
        !in_ci(),
        "CI is set and the generated {language} client test cannot run: {reasons}. Set it up with: {SETUP}"
    );
    println!("SKIPPED: generated {language} client test: {reasons}. Set it up with: {SETUP}");
    false
}

fn node_runs() -> bool {
    Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A fresh, empty output folder under `tests/clients/generated/`.
fn fresh(name: &str) -> PathBuf {
    let dir = clients_dir().join("generated").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the generated folder");
    dir
}

/// Run one step in `tests/clients`, echo its output, and fail the test unless it exits 0 in time.
fn step(label: &str, command: &mut Command) {
    let started = Instant::now();
    let out_file = tempfile::tempfile().expect("temp file");
    let err_file = tempfile::tempfile().expect("temp file");
    let mut child = command
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(out_file.try_clone().expect("clone"))
        .stderr(err_file.try_clone().expect("clone"))
        .spawn()
        .unwrap_or_else(|e| panic!("{label}: cannot start: {e}"));
    let status = super::wait_or_kill(&mut child, STEP_TIMEOUT);
    let read = |mut file: std::fs::File| {
        use std::io::{Read, Seek};
        let mut text = String::new();
        let _ = file.rewind();
        let _ = file.read_to_string(&mut text);
        text
    };
    let (out, err) = (read(out_file), read(err_file));
    println!(
        "--- {label}: {status:?} after {:.1} s ---\n{out}{err}",
        started.elapsed().as_secs_f64()
    );
    match status {
        Some(status) => assert!(status.success(), "{label} failed ({status}); output above"),
        None => panic!("{label} did not finish within {STEP_TIMEOUT:?}; output above"),
    }
}

/// A server with the producer, worker and operator tokens, and the environment a flow reads.
fn server(dir: &Path) -> (Server, Vec<(String, String)>) {
    let entries: Vec<String> = TOKENS.iter().map(|(r, t)| format!("{r}:{t}")).collect();
    let server = start(dir, &entries, &[]);
    let mut env = vec![("SETTLED_URL".to_owned(), server.base.clone())];
    for (role, token) in TOKENS {
        env.push((
            format!("SETTLED_{}_TOKEN", role.to_uppercase()),
            token.to_owned(),
        ));
    }
    (server, env)
}

#[test]
fn a_generated_typescript_client_runs_its_flow() {
    let _turn = super::one_at_a_time();
    let modules = clients_dir().join("node_modules");
    let bin = modules.join(".bin");
    let needs = [
        ("`node` is not on PATH", node_runs()),
        (
            "tests/clients/node_modules is missing (openapi-typescript, openapi-fetch, typescript)",
            bin.join("openapi-typescript").exists()
                && bin.join("tsc").exists()
                && modules.join("openapi-fetch/package.json").exists(),
        ),
    ];
    if !ready("TypeScript", &needs) {
        return;
    }
    fresh("ts");
    fresh("js");
    let spec = project().join("openapi.yaml");
    step(
        "openapi-typescript",
        Command::new(bin.join("openapi-typescript"))
            .arg(&spec)
            .args(["--output", "generated/ts/settled.d.ts"]),
    );
    step(
        "tsc --noEmit",
        Command::new(bin.join("tsc")).args(["--noEmit", "-p", "tsconfig.json"]),
    );
    // Checked above; now only turn it into JavaScript for node.
    step(
        "tsc (emit)",
        Command::new(bin.join("tsc")).args(["--noCheck", "-p", "tsconfig.json"]),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, env) = server(dir.path());
    step(
        "node generated/js/flow.js",
        Command::new("node").arg("generated/js/flow.js").envs(env),
    );
    drop(server);
}

#[test]
fn a_generated_python_client_runs_its_flow() {
    let _turn = super::one_at_a_time();
    let venv = clients_dir().join(".venv/bin");
    let needs = [(
        "tests/clients/.venv is missing (openapi-python-client)",
        venv.join("openapi-python-client").exists() && venv.join("python").exists(),
    )];
    if !ready("Python", &needs) {
        return;
    }
    fresh("python");
    // The generator formats its output with the ruff it brought along.
    let path = std::env::join_paths(std::iter::once(venv.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    step(
        "openapi-python-client generate",
        Command::new(venv.join("openapi-python-client"))
            .args(["generate", "--meta", "none", "--overwrite", "--path"])
            .arg(project().join("openapi.yaml"))
            .args(["--output-path", "generated/python/settled_client"])
            .env("PATH", path),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, env) = server(dir.path());
    step(
        "python flow.py",
        Command::new(venv.join("python"))
            .arg("flow.py")
            .env("PYTHONPATH", "generated/python")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .envs(env),
    );
    drop(server);
}
