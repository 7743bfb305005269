//! The reports as one Markdown table (the one RELIABILITY.md shows), and the
//! exit status.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::check::Report;

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
            r.scenario,
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
        let _ = writeln!(out, "| {} | {} |", r.scenario, cells.join(", "));
    }
    out
}

/// Failure when any count that must be zero is not, or a scenario failed.
pub fn verdict(reports: &[Report], failed_scenarios: usize) -> ExitCode {
    let mut bad = failed_scenarios > 0;
    for r in reports {
        for (what, n) in r.violations() {
            eprintln!("settled-faults: {}: {n} {what}", r.scenario);
            bad = true;
        }
    }
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
