//! The checker: a recorded run against the final state, counted.
//!
//! Every count here except the recovery times must be zero. The rules judge
//! only what the answers prove: a claim is *surely live* from its answer
//! until its request was sent plus `lease_ms` (the server granted it no
//! earlier than that), and *possibly live* until its answer plus `lease_ms`.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::record::{Answer, Entry, Final, Op, OpKind, Recording};
use super::recovery;

/// Slack for the server's clock against the harness's (both monotonic on
/// one host; the database-clock samples of a replica move it by a few ms).
pub const TOLERANCE_MS: u64 = 50;

/// What the checker found in one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    pub duration_ms: u64,
    /// Faults injected, all kinds.
    pub faults: usize,
    pub attempted: usize,
    pub acknowledged: usize,
    pub receipts: usize,
    /// Enqueue acknowledged; the receipt is missing or never finished.
    pub lost: usize,
    /// Finished more than once (two accepted, or accepted and skipped, …).
    pub settled_twice: usize,
    /// An outcome, extension or release acknowledged for a claim that was
    /// no longer the live lease (a later claim answered, the deadline past,
    /// or the claim already ended) when it was sent.
    pub stale_accepted: usize,
    /// The same, refused: what shows the run put the rule to the test.
    pub stale_refused: usize,
    /// A claim granted while an earlier claim of the receipt was surely live.
    pub overlapping_leases: usize,
    /// An acknowledged outcome or release with no entry in the history.
    pub missing_from_history: usize,
    /// Final state and history disagree.
    pub contradicting: usize,
    /// Receipts the server holds that no producer sent.
    pub unexpected: u64,
    /// Per fault kind: the longest time from the end of one of its
    /// injections (from the promotion, for a fault that changes the
    /// PostgreSQL writer) until throughput was back at half of what it was
    /// before (`None`: never back within the run).
    pub recovery_ms: BTreeMap<String, Option<u64>>,
    /// The same for every injection, in order.
    pub recovery_each_ms: BTreeMap<String, Vec<Option<u64>>>,
    /// Per fault kind that changes the writer, for every injection: from the
    /// promotion to the first enqueue or outcome acknowledged after it.
    pub first_commit_ms: BTreeMap<String, Vec<Option<u64>>>,
    /// Writer changes whose first commit came later than its bound.
    pub slow_recoveries: Vec<String>,
    /// Injections per fault kind.
    pub injected: BTreeMap<String, usize>,
    /// Asynchronous replication: lost and settled twice do not fail the run.
    pub async_replication: bool,
    /// Other failures: a fault kind never injected, a replica that did not
    /// follow the primary.
    pub problems: Vec<String>,
    /// The first few findings, to start debugging from.
    pub examples: Vec<String>,
}

impl Report {
    /// The counts that must be zero, by name.
    pub fn violations(&self) -> Vec<(&'static str, u64)> {
        let counts = [
            ("lost", self.lost as u64),
            ("settled twice", self.settled_twice as u64),
            ("stale commits accepted", self.stale_accepted as u64),
            ("overlapping leases", self.overlapping_leases as u64),
            (
                "acknowledged outcomes missing from history",
                self.missing_from_history as u64,
            ),
            ("history contradicting state", self.contradicting as u64),
            ("unexpected receipts", self.unexpected),
        ];
        counts.into_iter().filter(|(_, n)| *n > 0).collect()
    }

    fn note(&mut self, finding: String) {
        if self.examples.len() < 12 {
            self.examples.push(finding);
        }
    }
}

/// One granted claim and what happened under it.
struct Lease<'a> {
    claim: &'a Op,
    token: &'a str,
    row_version: u64,
    lease_ms: u64,
    /// Operations sent under this claim, in the order sent.
    under: Vec<&'a Op>,
}

impl Lease<'_> {
    /// Until when the lease is surely live: the claim's send time plus its
    /// lease, moved on by each acknowledged extension, cut short by the first
    /// outcome or release that may have been applied.
    fn surely_live_until(&self) -> u64 {
        let mut until = self.claim.sent_ms + self.lease_ms;
        for op in &self.under {
            match (&op.kind, &op.answer) {
                (OpKind::Extend { extend_ms, .. }, Answer::Ok) => {
                    until = until.max(op.sent_ms + extend_ms);
                }
                (OpKind::Outcome { .. } | OpKind::Release { .. }, Answer::Ok | Answer::Unknown) => {
                    return until.min(op.sent_ms);
                }
                _ => {}
            }
        }
        until
    }

    /// Until when the lease may have been live as of `before_ms` (`None`: an
    /// unanswered extension sent earlier may have moved it anywhere).
    fn possibly_live_until(&self, before_ms: u64) -> Option<u64> {
        let mut until = self.claim.answered_ms + self.lease_ms;
        for op in self.under.iter().filter(|o| o.sent_ms < before_ms) {
            if let OpKind::Extend { extend_ms, .. } = op.kind {
                match op.answer {
                    Answer::Ok => until = until.max(op.answered_ms + extend_ms),
                    Answer::Unknown => return None,
                    Answer::Refused(_) => {}
                }
            }
        }
        Some(until)
    }
}

fn token_of(kind: &OpKind) -> Option<&str> {
    match kind {
        OpKind::Enqueue => None,
        OpKind::Claim { token, .. }
        | OpKind::Outcome { token, .. }
        | OpKind::Extend { token, .. }
        | OpKind::Release { token } => Some(token),
    }
}

/// Whether an entry finishes its receipt (settled, skipped or dead-lettered).
fn finishes(entry: &Entry) -> bool {
    matches!(entry.outcome.as_str(), "accepted" | "skipped" | "permanent")
        || entry.route.as_deref() == Some("dead_lettered")
}

const FINISHED: [&str; 4] = ["settled", "skipped", "dead_lettered", "canceled"];

/// Check a run.
pub fn check(rec: &Recording) -> Report {
    let mut report = Report {
        scenario: rec.scenario.clone(),
        duration_ms: rec.duration_ms,
        faults: rec.faults.len(),
        attempted: rec.ops.len(),
        acknowledged: rec.ops.iter().filter(|o| o.answer == Answer::Ok).count(),
        receipts: rec.finals.len(),
        ..Report::default()
    };
    let mut by_receipt: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in &rec.ops {
        by_receipt.entry(op.receipt.as_str()).or_default().push(op);
    }
    for ops in by_receipt.values_mut() {
        ops.sort_by_key(|o| (o.sent_ms, o.answered_ms));
    }
    for (receipt, ops) in &by_receipt {
        let final_state = rec.finals.get(*receipt).and_then(Option::as_ref);
        check_enqueue(&mut report, receipt, ops, final_state);
        let leases = leases_of(ops);
        check_leases(&mut report, receipt, &leases);
        if let Some(fin) = final_state {
            check_history(&mut report, receipt, ops, fin);
        }
    }
    let found = rec.finals.values().filter(|f| f.is_some()).count() as u64;
    report.unexpected = rec.total_stored.saturating_sub(found);
    if report.unexpected > 0 {
        report.note(format!(
            "the server holds {} receipts, {found} of them sent by the producers",
            rec.total_stored
        ));
    }
    let measured = recovery::measure(rec);
    report.recovery_ms = measured.worst;
    report.recovery_each_ms = measured.each;
    report.first_commit_ms = measured.first_commit;
    report.slow_recoveries = measured.slow;
    for span in &rec.faults {
        *report.injected.entry(span.fault.clone()).or_default() += 1;
    }
    report.async_replication = rec.async_replication;
    report.problems.clone_from(&rec.problems);
    for kind in &rec.expected_faults {
        if !report.injected.contains_key(kind) {
            report.problems.push(format!("{kind} was never injected"));
        }
    }
    report
}

fn check_enqueue(report: &mut Report, receipt: &str, ops: &[&Op], fin: Option<&Final>) {
    let acked = ops
        .iter()
        .any(|o| o.kind == OpKind::Enqueue && o.answer == Answer::Ok);
    if !acked {
        return;
    }
    match fin {
        None => {
            report.lost += 1;
            report.note(format!("{receipt}: enqueue acknowledged, receipt missing"));
        }
        Some(f) if !FINISHED.contains(&f.state.as_str()) => {
            report.lost += 1;
            report.note(format!(
                "{receipt}: enqueue acknowledged, still {} at the end",
                f.state
            ));
        }
        Some(_) => {}
    }
}

fn leases_of<'a>(ops: &[&'a Op]) -> Vec<Lease<'a>> {
    let mut leases: Vec<Lease<'a>> = ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Claim {
                token,
                row_version,
                lease_ms,
            } => Some(Lease {
                claim: op,
                token,
                row_version: *row_version,
                lease_ms: *lease_ms,
                under: Vec::new(),
            }),
            _ => None,
        })
        .collect();
    let index: HashMap<&str, usize> = leases
        .iter()
        .enumerate()
        .map(|(i, l)| (l.token, i))
        .collect();
    for op in ops {
        if matches!(op.kind, OpKind::Claim { .. }) {
            continue;
        }
        if let Some(&i) = token_of(&op.kind).and_then(|t| index.get(t)) {
            leases[i].under.push(op);
        }
    }
    leases.sort_by_key(|l| l.row_version);
    leases
}

fn check_leases(report: &mut Report, receipt: &str, leases: &[Lease<'_>]) {
    for (i, lease) in leases.iter().enumerate() {
        // Two claims at once: a later one answered while this one was surely live.
        let live_until = lease.surely_live_until();
        for later in &leases[i + 1..] {
            if later.claim.answered_ms + TOLERANCE_MS < live_until {
                report.overlapping_leases += 1;
                report.note(format!(
                    "{receipt}: claim v{} answered at {} ms while claim v{} was live until {} ms",
                    later.row_version, later.claim.answered_ms, lease.row_version, live_until
                ));
            }
        }
        // Acknowledged work under a claim that was no longer the lease.
        let mut ended_at: Option<u64> = None;
        for op in &lease.under {
            let superseded = leases[i + 1..]
                .iter()
                .find(|l| l.claim.answered_ms < op.sent_ms);
            let late = lease
                .possibly_live_until(op.sent_ms)
                .filter(|until| op.sent_ms > until + TOLERANCE_MS);
            let why = if let Some(l) = superseded {
                Some(format!("claim v{} was answered before", l.row_version))
            } else if let Some(until) = late {
                Some(format!("the lease ended by {until} ms"))
            } else {
                ended_at
                    .filter(|at| *at < op.sent_ms)
                    .map(|at| format!("the claim was ended at {at} ms"))
            };
            match (&op.answer, why) {
                (Answer::Ok, Some(why)) => {
                    report.stale_accepted += 1;
                    report.note(format!(
                        "{receipt}: {:?} sent at {} ms under claim v{} acknowledged, but {why}",
                        op.kind, op.sent_ms, lease.row_version
                    ));
                }
                (Answer::Refused(_), Some(_)) => report.stale_refused += 1,
                _ => {}
            }
            if op.answer == Answer::Ok
                && matches!(op.kind, OpKind::Outcome { .. } | OpKind::Release { .. })
            {
                ended_at = Some(ended_at.map_or(op.answered_ms, |t| t.min(op.answered_ms)));
            }
        }
    }
}

fn check_history(report: &mut Report, receipt: &str, ops: &[&Op], fin: &Final) {
    // Every acknowledged outcome and release has its entry (matched one to one).
    let mut entries: Vec<Option<&Entry>> = fin.history.iter().map(Some).collect();
    for op in ops.iter().filter(|o| o.answer == Answer::Ok) {
        let (outcome, transcript) = match &op.kind {
            OpKind::Outcome {
                outcome,
                transcript_id,
                ..
            } => (outcome.as_str(), transcript_id.as_deref()),
            OpKind::Release { .. } => ("released", None),
            _ => continue,
        };
        let found = entries.iter_mut().find(|e| {
            e.is_some_and(|e| {
                e.outcome == outcome
                    && e.worker_id == op.worker
                    && (transcript.is_none() || e.transcript_id.as_deref() == transcript)
            })
        });
        match found {
            Some(slot) => *slot = None,
            None => {
                report.missing_from_history += 1;
                report.note(format!(
                    "{receipt}: {outcome} by {} acknowledged at {} ms, not in the history",
                    op.worker, op.answered_ms
                ));
            }
        }
    }
    // Finished once, and the state says what the finishing entry says.
    let finishing: Vec<(usize, &Entry)> = fin
        .history
        .iter()
        .enumerate()
        .filter(|(_, e)| finishes(e))
        .collect();
    if finishing.len() > 1 {
        report.settled_twice += 1;
        report.note(format!(
            "{receipt}: finished {} times in its history",
            finishing.len()
        ));
    }
    let last = finishing.last();
    let agrees = match (fin.state.as_str(), last) {
        ("settled", Some((_, e))) => {
            e.outcome == "accepted"
                && e.transcript_id.is_some()
                && e.transcript_id == fin.transcript_id
        }
        ("skipped", Some((_, e))) => e.outcome == "skipped",
        ("dead_lettered", Some((_, e))) => {
            e.outcome == "permanent" || e.route.as_deref() == Some("dead_lettered")
        }
        ("pending" | "leased" | "retry_scheduled", None) => true,
        _ => false,
    };
    let after_finish = last.is_some_and(|(i, _)| *i + 1 < fin.history.len());
    if !agrees || after_finish {
        report.contradicting += 1;
        report.note(format!(
            "{receipt}: state {} with history {:?}",
            fin.state,
            fin.history
                .iter()
                .map(|e| e.outcome.as_str())
                .collect::<Vec<_>>()
        ));
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
