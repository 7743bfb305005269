//! A first run with a wrong flag, path or server: each refusal says what was
//! tried and what to do, on stderr, once, with a non-zero exit, and leaves
//! nothing behind.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{launch, settled};

/// What a refused start printed, with its exit status; nothing may be
/// created in the working directory.
pub(super) struct Refused {
    pub(super) stderr: String,
    stdout: String,
    pub(super) code: Option<i32>,
    took: Duration,
}

pub(super) fn refused(args: &[&str]) -> Refused {
    let dir = tempfile::tempdir().unwrap();
    refused_in(dir.path(), args)
}

fn refused_in(dir: &std::path::Path, args: &[&str]) -> Refused {
    let before: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let started = Instant::now();
    let mut command = settled();
    command.current_dir(dir).args(args);
    // A free port of its own: these tests run side by side, and several
    // bind before they are refused (the default port would be taken).
    if !args.contains(&"--listen") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    let out = command.output().expect("run settled");
    let took = started.elapsed();
    assert!(!out.status.success(), "{args:?} should be refused");
    let after: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(before, after, "{args:?}: nothing is created when refused");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("settlement routing"),
        "{args:?}: no internal error prefix: {stderr}"
    );
    Refused {
        stderr,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        code: out.status.code(),
        took,
    }
}

impl Refused {
    pub(super) fn says(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "stderr lacks {needle:?}: {}",
                self.stderr
            );
        }
        self
    }
}

#[test]
fn a_port_in_use_is_refused_before_any_database_is_created() {
    let _turn = crate::turn(module_path!());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let answer = refused(&["--listen", &address]);
    answer.says(&[
        &format!("cannot listen on {address}"),
        "Another process listens on this port",
        "--listen :0",
    ]);
    assert_eq!(answer.code, Some(1));
}

#[test]
fn listen_takes_localhost_a_bare_port_and_a_leading_colon() {
    let _turn = crate::turn(module_path!());
    for given in ["localhost:0", ":0", "0"] {
        let dir = tempfile::tempdir().unwrap();
        let server = launch(dir.path(), given, &[]);
        let base = &server.base;
        assert!(
            base.starts_with("http://127.0.0.1:"),
            "--listen {given} listens on loopback: {base}"
        );
        let _ = server.kill();
    }
}

#[test]
fn other_listen_forms_are_refused_with_the_accepted_ones() {
    let _turn = crate::turn(module_path!());
    for given in ["example.com:8080", "127.0.0.1", "localhost", "eighty"] {
        let answer = refused(&["--listen", given]);
        answer.says(&["localhost:8080", ":8080", "127.0.0.1:8080", "0.0.0.0:8080"]);
        assert_eq!(answer.code, Some(2), "a flag that does not parse");
    }
    refused(&["--listen", "127.0.0.1"]).says(&["a port is missing"]);
    // The environment variable is read the same way.
    let dir = tempfile::tempdir().unwrap();
    let out = settled()
        .current_dir(dir.path())
        .env("SETTLED_LISTEN", "example.com:8080")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("localhost:8080"));
}

#[test]
fn a_sqlite_file_in_a_missing_directory_names_the_path_and_the_fix() {
    let _turn = crate::turn(module_path!());
    let answer = refused(&["--database-url", "sqlite:no/such/dir/settled.db"]);
    answer.says(&[
        "cannot open the SQLite database no/such/dir/settled.db",
        "the directory no/such/dir does not exist",
        "mkdir -p no/such/dir",
    ]);
    assert_eq!(answer.code, Some(1));
}

#[test]
fn a_sqlite_path_that_is_a_directory_suggests_a_file_in_it() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    refused_in(dir.path(), &["--database-url", "sqlite:data"]).says(&[
        "cannot open the SQLite database data",
        "data is a directory",
        "sqlite:data/settled.db",
    ]);
}

#[test]
fn a_database_url_without_a_known_scheme_shows_the_forms_and_never_the_password() {
    let _turn = crate::turn(module_path!());
    refused(&["--database-url", "mysql://app:hunter2@db/x"]).says(&[
        "unknown database URL scheme `mysql:`",
        "sqlite:PATH",
        "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    ]);
    let answer = refused(&["--database-url", "mysql://app:hunter2@db/x"]);
    assert!(!answer.stderr.contains("hunter2"), "{}", answer.stderr);
    refused(&["--database-url", "settled.db"]).says(&["did you mean sqlite:settled.db?"]);
}

/// Port 1 on loopback refuses connections: the answer names it at once,
/// instead of a pool timing out after --pg-connect-timeout-ms.
#[test]
fn an_unreachable_postgres_is_named_with_its_host_and_port_at_once() {
    let _turn = crate::turn(module_path!());
    let answer = refused(&[
        "--database-url",
        "postgres://settled:hunter2@127.0.0.1:1/settled",
        "--pg-connect-timeout-ms",
        "120000",
    ]);
    answer.says(&["connection refused to 127.0.0.1:1", "--database-url"]);
    assert!(!answer.stderr.contains("timed out"), "{}", answer.stderr);
    assert!(!answer.stderr.contains("hunter2"), "{}", answer.stderr);
    assert!(
        answer.took < Duration::from_secs(60),
        "answered without waiting for the connect timeout: {:?}",
        answer.took
    );
}

#[test]
fn an_invalid_schema_name_is_refused_with_the_rule() {
    let _turn = crate::turn(module_path!());
    let answer = refused(&["--pg-schema", "Billing-Queue"]);
    answer.says(&["invalid schema name `Billing-Queue`", "a-z, 0-9 and _"]);
    assert_eq!(answer.code, Some(2));
    refused(&["--pg-schema", "pg_settled"]).says(&["not with pg_"]);
}

#[test]
fn an_advertised_url_other_replicas_could_not_use_is_refused() {
    let _turn = crate::turn(module_path!());
    refused(&["--advertise-url", "http://10.0.0.5:8080/settled"]).says(&["no path"]);
    refused(&["--advertise-url", "ftp://10.0.0.5"]).says(&["an advertised URL is http://"]);
    refused(&["--advertise-url", "https://10.0.0.5"]).says(&["an advertised URL is http://"]);
    // Without tokens a replica answers loopback names only: the others'
    // forwarded requests would be refused.
    refused(&["--advertise-url", "http://10.0.0.5:8080"])
        .says(&["--advertise-url http://10.0.0.5:8080", "configure tokens"]);
}

#[test]
fn a_refused_retry_policy_is_printed_once() {
    let _turn = crate::turn(module_path!());
    let answer = refused(&["--max-retries", "33", "--log-format", "text"]);
    let both = format!("{}{}", answer.stdout, answer.stderr);
    assert_eq!(
        both.matches("max_retries must be 0..=32").count(),
        1,
        "stdout: {} stderr: {}",
        answer.stdout,
        answer.stderr
    );
}

#[test]
fn text_logs_carry_no_colours_when_stdout_is_not_a_terminal() {
    let _turn = crate::turn(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut child = settled()
        .current_dir(dir.path())
        .args(["--listen", "127.0.0.1:0", "--log-format", "text"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let listening = line.contains("listening on");
        seen.push(line);
        if listening {
            break;
        }
    }
    child.kill().unwrap();
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.contains("listening on")),
        "text log read: {seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "no escape codes in a pipe: {seen:?}"
    );
}

#[test]
fn help_points_at_rust_log_the_dashboard_and_the_api_docs() {
    let _turn = crate::turn(module_path!());
    for args in [&["--help"][..], &["serve", "--help"][..]] {
        let out = settled().args(args).output().unwrap();
        assert!(out.status.success());
        let help = String::from_utf8(out.stdout).unwrap();
        for needle in ["RUST_LOG", "dashboard", "/docs", "http://127.0.0.1:8080"] {
            assert!(
                help.contains(needle),
                "settled {args:?} lacks {needle}: {help}"
            );
        }
    }
}
