//! `settled healthcheck` against the real binary.

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::files;
use crate::process::Launch;

/// A token the servers of these tests accept (16..=256 characters).
const TOKEN: &str = "operator:healthcheck-test-token-0123";

/// `settled healthcheck ARGS` with `SETTLED_LISTEN` as given (removed when `None`).
fn healthcheck(listen: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_settled"));
    command.arg("healthcheck").args(args);
    run(command, listen)
}

fn run(mut command: Command, listen: Option<&str>) -> Output {
    command.env_remove("SETTLED_LISTEN");
    if let Some(listen) = listen {
        command.env("SETTLED_LISTEN", listen);
    }
    command.output().expect("run settled healthcheck")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit 1 with one line on standard error, starting `unhealthy: ` and holding `want`.
fn assert_unhealthy(out: &Output, want: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit 1: {out:?}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.starts_with("unhealthy: ") && stderr.contains(want),
        "{want:?} in {stderr:?}"
    );
}

fn assert_healthy(out: &Output, url: &str) {
    assert_eq!(out.status.code(), Some(0), "exit 0: {out:?}");
    assert_eq!(
        text(&out.stdout).trim(),
        format!("healthy: {url} answered 200")
    );
}

#[test]
fn exits_0_for_a_running_server_and_1_with_a_reason_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("settled.db").display());
    let server = Launch::new(dir.path()).database(&url).spawn().ready();
    let address = server.address.clone();

    let ready = format!("http://{address}/readyz");
    assert_healthy(&healthcheck(None, &["--listen", &address]), &ready);
    // The variable `serve` listens by, as in the image.
    assert_healthy(&healthcheck(Some(&address), &[]), &ready);
    assert_healthy(
        &healthcheck(Some(&address), &["--live"]),
        &format!("http://{address}/healthz"),
    );
    // --url wins over the variable.
    assert_healthy(
        &healthcheck(Some("127.0.0.1:1"), &["--url", &ready]),
        &ready,
    );
    assert_unhealthy(
        &healthcheck(None, &["--url", &format!("http://{address}/nowhere")]),
        "answered 404",
    );
    server.stop();

    // A closed port: refused at once.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let started = Instant::now();
    assert_unhealthy(
        &healthcheck(None, &["--listen", &closed.to_string()]),
        &format!("cannot connect to http://{closed}/readyz"),
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // A port that accepts and never answers (a server still migrating): the time limit.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_address = silent.local_addr().unwrap().to_string();
    let started = Instant::now();
    assert_unhealthy(
        &healthcheck(None, &["--listen", &silent_address, "--timeout", "300ms"]),
        "within 300ms",
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);

    // A URL it cannot ask is a reason too; a flag that does not parse is clap's exit 2.
    let out = healthcheck(None, &["--url", "https://127.0.0.1:8080/readyz"]);
    assert_unhealthy(&out, "https is not supported");
    assert_eq!(
        healthcheck(None, &["--timeout", "0s"]).status.code(),
        Some(2)
    );
}

/// The image's HEALTHCHECK and the compose file's `healthcheck.test`, run as written (the
/// binary's path aside) in the environment they run in: `SETTLED_LISTEN=0.0.0.0:PORT`, which
/// the check asks on loopback.
#[test]
fn the_dockerfile_and_compose_health_checks_run_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("settled.db").display());
    let server = Launch::new(dir.path())
        .database(&url)
        .listen("0.0.0.0:0")
        .args(&["--token", TOKEN])
        .spawn()
        .ready();
    let port = files::port_of(&server.address);
    let listen = format!("0.0.0.0:{port}");

    let image = files::dockerfile();
    let (_, healthcheck) = image
        .iter()
        .find(|(name, _)| name == "HEALTHCHECK")
        .expect("the Dockerfile has a HEALTHCHECK");
    let (_, exec) = healthcheck
        .split_once("CMD ")
        .expect("HEALTHCHECK … CMD [...]");
    let image_check: Vec<String> = serde_json::from_str(exec).expect("CMD in exec form");
    let compose = files::yaml("deploy/compose.yaml");
    let compose_check: Vec<String> = compose["services"]["settled"]["healthcheck"]["test"]
        .as_array()
        .expect("settled's healthcheck.test")
        .iter()
        .map(|v| v.as_str().expect("a word").to_owned())
        .collect();
    assert_eq!(compose_check[0], "CMD", "exec form, no shell in the image");

    for argv in [&image_check[..], &compose_check[1..]] {
        assert_eq!(argv[0], "/usr/local/bin/settled", "{argv:?}");
        assert_eq!(argv[1], "healthcheck", "{argv:?}");
        let mut command = Command::new(env!("CARGO_BIN_EXE_settled"));
        command.args(&argv[1..]);
        let out = run(command, Some(&listen));
        assert_healthy(&out, &format!("http://127.0.0.1:{port}/readyz"));
    }
    server.stop();

    let mut command = Command::new(env!("CARGO_BIN_EXE_settled"));
    command.args(&image_check[1..]);
    let out = run(command, Some(&listen));
    assert_unhealthy(&out, "cannot connect");
}
