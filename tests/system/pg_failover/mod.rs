//! A PostgreSQL failover, on a private primary and its synchronous streaming
//! standby (PostgreSQL 15's server binaries, started by the test): a primary
//! demoted in place behind a proxy that moves new connections to the
//! promoted standby, as DNS or a virtual IP does; a primary that goes silent
//! (its packets dropped by nftables) behind a multi-host URL; and the forms
//! of `--database-url` that name several hosts, or a parameter settled would
//! not honour.
//!
//! Runs when `SETTLED_TEST_POSTGRES_URL` is set; prints SKIPPED and passes
//! otherwise, or when the server binaries, `nft` or root are missing. With
//! the variable set and as root (CI), a missing binary fails the test: CI
//! must not skip it silently.

use crate::common;
use crate::common::process::{Launch, Server};
use crate::common::rng::now_ms;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod api;
mod demoted;
mod net;
mod pair;
mod proxy;
mod silent;
mod urls;

use api::*;

/// Where Debian's PostgreSQL 15 server binaries live.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// Whether this process runs as root (the owner of `/proc/self` is the
/// process's effective user).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A program on the `PATH`, or in the `sbin` directories a non-login root
/// shell may leave out of it.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Whether `test` can run here; if not, says why (SKIPPED) or, in CI (the
/// PostgreSQL variable set and root), fails naming what is missing.
fn may_run(test: &str, needs_nft: bool) -> bool {
    if std::env::var_os(common::POSTGRES_ENV).is_none() {
        eprintln!(
            "SKIPPED: {} is not set, so {test} did not run",
            common::POSTGRES_ENV
        );
        return false;
    }
    let root = is_root();
    let mut missing: Vec<String> = ["initdb", "pg_ctl", "pg_basebackup", "postgres"]
        .iter()
        .map(|tool| Path::new(PG_BIN).join(tool))
        .filter(|path| !path.is_file())
        .map(|path| path.display().to_string())
        .collect();
    // As root the servers run as `postgres` (PostgreSQL refuses root).
    if root && program("runuser").is_none() {
        missing.push("runuser".into());
    }
    if needs_nft && program("nft").is_none() {
        missing.push("nft (nftables)".into());
    }
    if needs_nft && !root {
        eprintln!("SKIPPED: {test} drops packets with nftables, which needs root");
        return false;
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        !root,
        "{test}: {} is set and this runs as root, yet {missing:?} are missing; install \
         postgresql-15 and nftables (CI must not skip this test)",
        common::POSTGRES_ENV
    );
    eprintln!("SKIPPED: {test} needs {missing:?}");
    false
}

/// Start `n` replicas of settled on `url` at once (they migrate the same
/// database concurrently), waiting without blocking the runtime, which may
/// serve the proxy they reach their database through.
async fn start_replicas(dir: &Path, n: usize, url: &str, args: &[&str]) -> Vec<Server> {
    let starting: Vec<_> = (0..n)
        .map(|_| Launch::new(dir).database(url).args(args).spawn())
        .collect();
    let mut replicas = Vec::new();
    for replica in starting {
        replicas.push(replica.ready_async().await);
    }
    replicas
}

/// Prints the last lines each replica logged when the test fails, wherever
/// it fails (an assertion, a helper's deadline, a request that hung).
struct Witness(Vec<(String, Arc<Mutex<Vec<String>>>)>);

impl Witness {
    fn of(replicas: &[(&str, &Server)]) -> Self {
        Self(
            replicas
                .iter()
                .map(|(name, server)| ((*name).to_owned(), server.logs.clone()))
                .collect(),
        )
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (name, logs) in &self.0 {
            let logs = logs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let tail = logs[logs.len().saturating_sub(40)..].join("\n");
            eprintln!("--- the last lines settled {name} logged ---\n{tail}");
        }
    }
}

/// The median of some measurements.
fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// The `database` section of `/v1/info`: which host is in use, whether it
/// takes writes, how many failovers this replica has been through.
#[track_caller]
fn database_of(info: &Value) -> &Value {
    let database = &info["database"];
    assert!(
        database.is_object(),
        "/v1/info has no `database` section on PostgreSQL: {info}"
    );
    database
}
