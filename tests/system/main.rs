//! Whole-system tests: the real binary (start-up errors, file descriptors,
//! crashes, restarts, database faults, a PostgreSQL outage, replicas), the
//! fault harness's checker, lease races on the system clock, the bench and
//! the API fuzzer. One binary, so that `cargo test` builds and links it once;
//! each module's tests still run while no other module's do ([`turn`]), as
//! when each module was a binary of its own: they load the machine and some
//! of them measure time.

#[path = "../common/mod.rs"]
mod common;

mod binary;
mod crash_recovery;
mod db_faults;
mod lease_races;
mod pg_bulk;
mod pg_failover;
mod pg_outage;
mod pg_replicas;
mod restart_safety;
mod schemathesis;

use std::sync::{Condvar, Mutex};

/// Which module's tests are running, and how many of them.
static RUNNING: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
static CHANGED: Condvar = Condvar::new();

/// A module's turn: held for a test's whole run.
pub struct Turn;

impl Drop for Turn {
    fn drop(&mut self) {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        running.1 -= 1;
        if running.1 == 0 {
            running.0 = None;
            CHANGED.notify_all();
        }
    }
}

/// Wait until no other module's test runs, then run alongside the tests of
/// the same `module` (pass `module_path!()`). A failing test still ends
/// its turn: the guard is dropped while it unwinds.
pub fn turn(module: &'static str) -> Turn {
    // The top module: `system::binary::start_errors` runs with `system::binary`.
    let top = module
        .splitn(3, "::")
        .take(2)
        .collect::<Vec<_>>()
        .join("::");
    let top: &'static str = Box::leak(top.into_boxed_str());
    let mut running = RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    while running.0.is_some_and(|m| m != top) {
        running = CHANGED
            .wait(running)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    running.0 = Some(top);
    running.1 += 1;
    Turn
}
