//! The reports as one Markdown table (the one RELIABILITY.md shows), and the
//! exit status.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::check::Report;
use super::recovery::first_commit_bound_ms;

/// The scenario's name, and how PostgreSQL replicated when not as usual.
fn label(r: &Report) -> String {
    if r.async_replication {
        format!("{} (async)", r.scenario)
    } else {
        r.scenario.clone()
    }
}

fn secs(ms: Option<u64>) -> String {
    ms.map_or_else(
        || "never".into(),
        |ms| format!("{:.2}", ms as f64 / 1_000.0),
    )
}

/// "max / median s" and every value, in order (`None`: never).
fn summary(each: &[Option<u64>]) -> (String, String) {
    if each.is_empty() {
        return ("–".into(), "–".into());
    }
    let mut sorted = each.to_vec();
    // Never is the longest.
    sorted.sort_by_key(|v| v.unwrap_or(u64::MAX));
    let max = sorted[sorted.len() - 1];
    let median = sorted[(sorted.len() - 1) / 2];
    let list: Vec<String> = each.iter().map(|v| secs(*v)).collect();
    (
        format!("{} / {} s", secs(max), secs(median)),
        list.join(", "),
    )
}

/// Per fault kind, for runs with faults that change the PostgreSQL writer.
fn per_fault(out: &mut String, r: &Report) {
    let _ = write!(
        out,
        "\n{}: per fault kind, max / median over its injections and each in order, in \
         seconds. *First commit*: from the promotion of the new primary (the first instant it \
         was seen taking writes) to the first enqueue or outcome acknowledged after it (bound: \
         switchover 5 s, failover and demote-in-place 10 s). *Back at half rate*: from the \
         promotion (writer changes) or the fault's end (the others) until outcomes were \
         acknowledged at half the rate of the 5 s before it began.\n\n\
         | fault | injected | first commit | each | back at half rate | each |\n\
         |---|---|---|---|---|---|\n",
        label(r)
    );
    for (fault, n) in &r.injected {
        let first = r.first_commit_ms.get(fault).map_or(&[][..], Vec::as_slice);
        let back = r.recovery_each_ms.get(fault).map_or(&[][..], Vec::as_slice);
        let (first_sum, first_each) = summary(first);
        let (back_sum, back_each) = summary(back);
        let bound =
            first_commit_bound_ms(fault).map_or(String::new(), |b| format!(" (≤ {} s)", b / 1_000));
        let _ = writeln!(
            out,
            "| {fault} | {n} | {first_sum}{} | {first_each} | {back_sum} | {back_each} |",
            if first.is_empty() { "" } else { bound.as_str() }
        );
    }
    if r.async_replication {
        let _ = writeln!(
            out,
            "\n{}: PostgreSQL replicated asynchronously: a failover may lose commits the old \
             primary acknowledged, so lost and settled twice are counted but do not fail the \
             run; it is evidence for the docs.",
            label(r)
        );
    }
}

pub fn render(reports: &[Report]) -> String {
    let mut out = String::from(
        "\n| scenario | time | faults | ops attempted | acknowledged | receipts | lost | settled twice \
         | stale commits refused | stale commits accepted | overlapping leases | outcomes missing from history \
         | history contradicting state | unexpected receipts |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let _ = writeln!(
            out,
            "| {} | {:.0} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            label(r),
            r.duration_ms as f64 / 1_000.0,
            r.faults,
            r.attempted,
            r.acknowledged,
            r.receipts,
            r.lost,
            r.settled_twice,
            r.stale_refused,
            r.stale_accepted,
            r.overlapping_leases,
            r.missing_from_history,
            r.contradicting,
            r.unexpected
        );
    }
    out.push_str(
        "\nRecovery: the longest time, per fault, from its end until outcomes were acknowledged \
         at half the rate of the 5 s before it began (counted over a quarter second).\n\n\
         | scenario | recovery |\n|---|---|\n",
    );
    for r in reports {
        let cells: Vec<String> = r
            .recovery_ms
            .iter()
            .map(|(fault, ms)| match ms {
                Some(ms) => format!("{fault} {:.2} s", *ms as f64 / 1_000.0),
                None => format!("{fault} not back within the run"),
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", label(r), cells.join(", "));
    }
    for r in reports.iter().filter(|r| !r.first_commit_ms.is_empty()) {
        per_fault(&mut out, r);
    }
    out
}

/// Failure when any count that must be zero is not, or a scenario failed.
pub fn verdict(reports: &[Report], failed_scenarios: usize) -> ExitCode {
    let mut bad = failed_scenarios > 0;
    for r in reports {
        for (what, n) in r.violations() {
            if r.async_replication && matches!(what, "lost" | "settled twice") {
                eprintln!(
                    "settled-faults: {}: {n} {what} (not a failure: with asynchronous \
                     replication a failover may lose acknowledged commits; evidence for the docs)",
                    label(r)
                );
                continue;
            }
            eprintln!("settled-faults: {}: {n} {what}", label(r));
            bad = true;
        }
        if r.async_replication && !r.violations().is_empty() {
            eprintln!(
                "settled-faults: {}: with asynchronous replication, a commit acknowledged by a \
                 primary just before it failed may be missing on the standby promoted in its \
                 place: it shows as lost, settled twice, or an outcome missing from history \
                 (see the findings and the failovers' times)",
                label(r)
            );
        }
        for slow in &r.slow_recoveries {
            eprintln!("settled-faults: {}: {slow}", label(r));
            bad = true;
        }
        for problem in &r.problems {
            eprintln!("settled-faults: {}: {problem}", label(r));
            bad = true;
        }
    }
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
