//! The plain-SQL cycle's decisions and end check, without a database.

use super::*;

fn cycle(mix: &str, receipts: usize) -> Cycle {
    let w = Workload {
        receipts,
        preload: 0,
        enqueue_batch: 10,
        producers: 1,
        workers: 1,
        batch: 10,
        lease_ms: 1000,
        mix: mix.parse().expect("mix"),
        deadline: std::time::Duration::from_secs(1),
        groups: 0,
        carry: false,
    };
    let ids = Ids {
        prefix: "raw-t".into(),
        groups: 0,
    };
    Cycle::new(w, super::super::server::FAST_RETRY, ids, "round")
}

fn leased(id: &str, attempts: i64) -> Leased {
    Leased {
        id: id.into(),
        attempts,
    }
}

#[test]
fn retries_until_the_policy_says_dead_letter() {
    let c = cycle("retryable=1000000,accepted=1", 1);
    let retry = c
        .decide(leased("raw-t-0", 0), "t".into(), 100)
        .expect("plan");
    assert_eq!((retry.status, retry.route), ("active", "retry_scheduled"));
    assert_eq!((retry.attempts, retry.attempt, retry.nv), (1, 1, Some(101)));
    assert_eq!(retry.fin, None);
    // FAST_RETRY allows 3 retries: the 4th failure is final.
    let last = c
        .decide(leased("raw-t-0", 3), "t".into(), 100)
        .expect("plan");
    assert_eq!(
        (last.status, last.route),
        ("dead_lettered", "dead_lettered")
    );
    assert_eq!((last.attempts, last.fin, last.nv), (4, Some(100), None));
}

#[test]
fn accepted_rows_settle_with_their_transcript() {
    let c = cycle("accepted=1", 1);
    let done = c.decide(leased("raw-t-7", 2), "t".into(), 5).expect("plan");
    assert_eq!((done.status, done.outcome), ("settled", "accepted"));
    assert_eq!(
        (done.tx.as_deref(), done.attempts, done.attempt),
        (Some("tx-7"), 2, 3)
    );
    assert!(c.decide(leased("other-1", 0), "t".into(), 5).is_err());
}

#[test]
fn the_end_check_reports_what_the_database_contradicts() {
    let c = cycle("accepted=1", 2);
    c.tally(&[
        c.decide(leased("raw-t-0", 0), "a".into(), 1).expect("plan"),
        c.decide(leased("raw-t-1", 0), "b".into(), 1).expect("plan"),
    ]);
    let good = EndCounts {
        finished: 2,
        settled: 2,
        accepted: 2,
        ..EndCounts::default()
    };
    let mut failures = Vec::new();
    c.check(&good, &mut failures);
    assert!(failures.is_empty(), "{failures:?}");
    let twice = EndCounts {
        accepted: 3,
        accepted_twice: 1,
        ..good
    };
    c.check(&twice, &mut failures);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[1].contains("rows accepted twice"), "{failures:?}");
}
