//! The checker's tests: recorded runs with one fault each, which it must report.

use super::*;

fn op(receipt: &str, worker: &str, sent: u64, answered: u64, answer: Answer, kind: OpKind) -> Op {
    Op {
        receipt: receipt.into(),
        worker: worker.into(),
        sent_ms: sent,
        answered_ms: answered,
        answer,
        kind,
    }
}

fn claim(token: &str, version: u64) -> OpKind {
    OpKind::Claim {
        token: token.into(),
        row_version: version,
        lease_ms: 1_000,
    }
}

fn accepted(token: &str) -> OpKind {
    OpKind::Outcome {
        token: token.into(),
        outcome: "accepted".into(),
        transcript_id: Some(format!("tx-{token}")),
    }
}

fn entry(outcome: &str, worker: &str, transcript: Option<&str>) -> Entry {
    Entry {
        outcome: outcome.into(),
        worker_id: worker.into(),
        transcript_id: transcript.map(Into::into),
        route: None,
    }
}

/// A clean run: r1 enqueued, claimed by w1, settled; r2 claimed by w1
/// whose lease lapsed, refused late, claimed again by w2 and settled.
fn clean() -> Recording {
    let ops = vec![
        op("r1", "p", 0, 5, Answer::Ok, OpKind::Enqueue),
        op("r1", "w1", 10, 12, Answer::Ok, claim("a", 1)),
        op(
            "r1",
            "w1",
            100,
            104,
            Answer::Ok,
            OpKind::Extend {
                token: "a".into(),
                extend_ms: 1_000,
            },
        ),
        op("r1", "w1", 900, 905, Answer::Ok, accepted("a")),
        op("r2", "p", 0, 5, Answer::Ok, OpKind::Enqueue),
        op("r2", "w1", 10, 12, Answer::Ok, claim("b", 1)),
        op("r2", "w2", 1_100, 1_102, Answer::Ok, claim("c", 2)),
        op(
            "r2",
            "w1",
            1_200,
            1_201,
            Answer::Refused("lease_conflict".into()),
            accepted("b"),
        ),
        op("r2", "w2", 1_300, 1_305, Answer::Unknown, accepted("c")),
        op("r2", "w2", 1_310, 1_315, Answer::Ok, accepted("c")),
    ];
    let mut finals = BTreeMap::new();
    finals.insert(
        "r1".into(),
        Some(Final {
            state: "settled".into(),
            transcript_id: Some("tx-a".into()),
            history: vec![entry("accepted", "w1", Some("tx-a"))],
        }),
    );
    finals.insert(
        "r2".into(),
        Some(Final {
            state: "settled".into(),
            transcript_id: Some("tx-c".into()),
            history: vec![entry("accepted", "w2", Some("tx-c"))],
        }),
    );
    Recording {
        scenario: "test".into(),
        ops,
        faults: Vec::new(),
        finals,
        total_stored: 2,
        duration_ms: 2_000,
        ..Recording::default()
    }
}

#[test]
fn a_clean_run_has_nothing_to_report() {
    let report = check(&clean());
    assert!(report.violations().is_empty(), "{report:#?}");
    assert_eq!(report.acknowledged, 8);
}

#[test]
fn a_lost_receipt_is_reported() {
    let mut run = clean();
    run.finals.insert("r1".into(), None);
    run.total_stored = 1;
    let report = check(&run);
    assert_eq!(report.lost, 1, "{report:#?}");
    assert_eq!(report.violations(), vec![("lost", 1)]);

    // Present but never finished is lost too.
    let mut run = clean();
    if let Some(Some(f)) = run.finals.get_mut("r1") {
        f.state = "pending".into();
        f.history.clear();
        f.transcript_id = None;
    }
    assert_eq!(check(&run).lost, 1);
}

#[test]
fn a_receipt_settled_twice_is_reported() {
    let mut run = clean();
    if let Some(Some(f)) = run.finals.get_mut("r2") {
        f.history.insert(0, entry("accepted", "w1", Some("tx-b")));
    }
    let report = check(&run);
    assert_eq!(report.settled_twice, 1, "{report:#?}");
    assert!(report.violations().contains(&("settled twice", 1)));
}

#[test]
fn a_stale_commit_accepted_is_reported() {
    // w1's late outcome under claim b, sent after w2's claim c was answered, acknowledged.
    let mut run = clean();
    run.ops[7].answer = Answer::Ok;
    if let Some(Some(f)) = run.finals.get_mut("r2") {
        f.history.insert(0, entry("accepted", "w1", Some("tx-b")));
    }
    let report = check(&run);
    assert_eq!(report.stale_accepted, 1, "{report:#?}");

    // A commit after the deadline accepted, though no one claimed again.
    let mut run = clean();
    run.ops[3].sent_ms = 2_200;
    run.ops[3].answered_ms = 2_201;
    run.duration_ms = 3_000;
    let report = check(&run);
    assert_eq!(report.stale_accepted, 1, "{report:#?}");
    assert_eq!(report.violations(), vec![("stale commits accepted", 1)]);
}

#[test]
fn overlapping_leases_are_reported() {
    // w2's claim of r2 answered at 500 ms, while w1's lease (sent at 10, 1 000 ms) was live.
    let mut run = clean();
    run.ops[6].sent_ms = 498;
    run.ops[6].answered_ms = 500;
    let report = check(&run);
    assert_eq!(report.overlapping_leases, 1, "{report:#?}");
    // The same claim after w1's lease surely ended is no overlap.
    run.ops[6].answered_ms = 1_011;
    run.ops[6].sent_ms = 1_010;
    assert_eq!(check(&run).overlapping_leases, 0);
}

#[test]
fn an_outcome_missing_from_history_is_reported() {
    let mut run = clean();
    if let Some(Some(f)) = run.finals.get_mut("r1") {
        f.history.clear();
    }
    let report = check(&run);
    assert_eq!(report.missing_from_history, 1, "{report:#?}");
    // And the state now contradicts the history.
    assert_eq!(report.contradicting, 1);
}

#[test]
fn an_unexpected_receipt_is_reported() {
    let mut run = clean();
    run.total_stored = 3;
    assert_eq!(check(&run).unexpected, 1);
}

#[test]
fn recovery_is_measured_from_the_end_of_the_fault() {
    // 10 outcomes a second before the fault, none for 2 s after it, then again.
    let mut run = Recording {
        duration_ms: 20_000,
        ..Recording::default()
    };
    for t in (0..20_000).step_by(100) {
        if !(6_000..9_000).contains(&t) {
            run.ops.push(op("r", "w", t, t, Answer::Ok, accepted("x")));
        }
    }
    run.faults.push(super::super::record::FaultSpan {
        fault: "kill".into(),
        start_ms: 6_000,
        end_ms: 7_000,
        promoted_ms: None,
    });
    let report = check(&run);
    let back = report.recovery_ms["kill"].expect("recovered");
    assert!((1_500..=2_000).contains(&back), "{back}");
}

#[test]
fn a_writer_change_is_measured_from_the_promotion_and_bounded() {
    // Commits every 100 ms, none from 5 s to 12 s: a failover promoted at
    // 8 s (first commit 4 s later) and a switchover promoted at 6 s (6 s
    // later, over its bound of 5 s).
    let mut run = Recording {
        duration_ms: 20_000,
        expected_faults: vec!["failover".into(), "switchover".into(), "kill".into()],
        ..Recording::default()
    };
    for t in (0..20_000).step_by(100) {
        if !(5_000..12_000).contains(&t) {
            run.ops.push(op("r", "w", t, t, Answer::Ok, accepted("x")));
        }
    }
    for (fault, promoted) in [("failover", 8_000), ("switchover", 6_000)] {
        run.faults.push(super::super::record::FaultSpan {
            fault: fault.into(),
            start_ms: 5_000,
            end_ms: promoted,
            promoted_ms: Some(promoted),
        });
    }
    let report = check(&run);
    assert_eq!(report.first_commit_ms["failover"], vec![Some(4_000)]);
    assert_eq!(report.first_commit_ms["switchover"], vec![Some(6_000)]);
    // Counted over quarter seconds: the first window with half the rate
    // starts a little before the first commit.
    let back = report.recovery_each_ms["failover"][0].expect("recovered");
    assert!((3_750..=4_000).contains(&back), "{back}");
    assert_eq!(
        report.slow_recoveries.len(),
        1,
        "{:?}",
        report.slow_recoveries
    );
    assert!(report.slow_recoveries[0].starts_with("switchover"));
    assert_eq!(report.problems, vec!["kill was never injected".to_owned()]);
    let table = super::super::table::render(&[report]);
    assert!(
        table.contains("| failover | 1 | 4.00 / 4.00 s (≤ 10 s) | 4.00 |"),
        "{table}"
    );
}
