//! The status counts around a run: what must have moved, and what must not.

use crate::common::Ledger;
use crate::http::Counts;
use crate::inproc::Workload;

/// `GET /v1/status` before and after: every receipt of the run finished, the
/// finished counts match the routes the client saw, nothing else moved.
pub fn check(
    before: &Counts,
    after: &Counts,
    w: &Workload,
    ledger: &Ledger,
    fresh: bool,
    failures: &mut Vec<String>,
) {
    let delta = |a: u64, b: u64| i128::from(a) - i128::from(b);
    let settled = delta(after.settled, before.settled);
    let skipped = delta(after.skipped, before.skipped);
    let dead = delta(after.dead_lettered, before.dead_lettered);
    let n = w.receipts as i128;
    if settled + skipped + dead != n {
        failures.push(format!(
            "status: settled+skipped+dead_lettered grew by {} for {n} receipts",
            settled + skipped + dead
        ));
    }
    let seen = [
        ("settled", settled, &ledger.settled),
        ("skipped", skipped, &ledger.skipped),
        ("dead_lettered", dead, &ledger.dead_lettered),
    ];
    for (name, grew, routes) in seen {
        let routes = i128::from(Ledger::get(routes));
        if grew != routes {
            failures.push(format!(
                "status: {name} grew by {grew} but the client saw {routes} such routes"
            ));
        }
    }
    let active = [
        ("pending", after.pending, before.pending),
        ("leased", after.leased, before.leased),
        (
            "retry_scheduled",
            after.retry_scheduled,
            before.retry_scheduled,
        ),
    ];
    for (name, now, then) in active {
        if now != then {
            failures.push(format!("status: {name} was {then} before and {now} after"));
        }
    }
    if fresh && (after.pending != w.preload as u64 || after.leased + after.retry_scheduled != 0) {
        failures.push(format!(
            "status: a fresh database ends with pending {} (preload {}), leased {}, retry_scheduled {}",
            after.pending, w.preload, after.leased, after.retry_scheduled
        ));
    }
}
