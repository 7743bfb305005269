//! Recovery times, measured, not judged, except one bound: after a fault
//! that changes the PostgreSQL writer (a switchover, a failover, a demotion
//! in place), the first commit must come within a few seconds of the
//! promotion.

use std::collections::BTreeMap;

use super::record::{Answer, OpKind, Recording};

/// How long the windows are that recovery counts outcomes in.
const WINDOW_MS: u64 = 250;

/// The longest time from a promotion to the first acknowledged commit, per
/// fault kind that changes the writer.
pub fn first_commit_bound_ms(fault: &str) -> Option<u64> {
    match fault {
        "switchover" => Some(5_000),
        "failover" | "demote-in-place" => Some(10_000),
        _ => None,
    }
}

/// What [`measure`] found.
#[derive(Default)]
pub struct Measured {
    /// Per fault kind, the longest time back to half the rate (`None`: never).
    pub worst: BTreeMap<String, Option<u64>>,
    /// The same for every injection, in order.
    pub each: BTreeMap<String, Vec<Option<u64>>>,
    /// Per writer-changing kind, every injection's promotion to first commit.
    pub first_commit: BTreeMap<String, Vec<Option<u64>>>,
    /// The writer changes over their bound, described.
    pub slow: Vec<String>,
}

/// Sorted times, counted over spans.
struct Times(Vec<u64>);

impl Times {
    fn count(&self, from: u64, to: u64) -> usize {
        self.0.partition_point(|t| *t < to) - self.0.partition_point(|t| *t < from)
    }

    fn first_from(&self, from: u64) -> Option<u64> {
        self.0.get(self.0.partition_point(|t| *t < from)).copied()
    }
}

/// Per injection: from its end (from the promotion, for a writer change) to
/// the start of the first quarter second with at least half the outcome rate
/// of the five seconds before it began; and for a writer change, from the
/// promotion to the first enqueue or outcome answered 2xx after it.
pub fn measure(rec: &Recording) -> Measured {
    let times = |keep: fn(&OpKind) -> bool| {
        let mut t: Vec<u64> = rec
            .ops
            .iter()
            .filter(|o| o.answer == Answer::Ok && keep(&o.kind))
            .map(|o| o.answered_ms)
            .collect();
        t.sort_unstable();
        Times(t)
    };
    let outcomes = times(|k| matches!(k, OpKind::Outcome { .. }));
    let commits = times(|k| matches!(k, OpKind::Outcome { .. } | OpKind::Enqueue));
    let mut measured = Measured::default();
    for span in &rec.faults {
        let from = span.promoted_ms.unwrap_or(span.end_ms);
        // Outcomes per window before the fault, and the first window after
        // it with half as many (short windows: a fault's effect is often
        // over in less than a second).
        let before = outcomes.count(span.start_ms.saturating_sub(5_000), span.start_ms) as f64
            * WINDOW_MS as f64
            / 5_000.0;
        let mut back = None;
        if before > 0.0 {
            let mut t = from;
            while t + WINDOW_MS <= rec.duration_ms {
                if outcomes.count(t, t + WINDOW_MS) as f64 >= before / 2.0 {
                    back = Some(t - from);
                    break;
                }
                t += 50;
            }
        } else {
            back = Some(0);
        }
        let slot = measured.worst.entry(span.fault.clone()).or_insert(Some(0));
        *slot = match (*slot, back) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        measured
            .each
            .entry(span.fault.clone())
            .or_default()
            .push(back);

        let Some(bound) = first_commit_bound_ms(&span.fault) else {
            continue;
        };
        let at = span.start_ms as f64 / 1e3;
        let first = span
            .promoted_ms
            .and_then(|p| commits.first_from(p).map(|t| t - p));
        measured
            .first_commit
            .entry(span.fault.clone())
            .or_default()
            .push(first);
        match (span.promoted_ms, first) {
            (None, _) => measured.slow.push(format!(
                "{} at {at:.1} s: no new primary was seen",
                span.fault
            )),
            (Some(_), None) => measured.slow.push(format!(
                "{} at {at:.1} s: no commit acknowledged after the promotion",
                span.fault
            )),
            (Some(p), Some(ms)) if ms > bound => measured.slow.push(format!(
                "{} at {at:.1} s: first commit {:.2} s after the promotion (at {:.1} s), over \
                 the bound of {} s",
                span.fault,
                ms as f64 / 1e3,
                p as f64 / 1e3,
                bound / 1_000
            )),
            _ => {}
        }
    }
    measured
}
