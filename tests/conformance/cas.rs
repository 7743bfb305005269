//! The outcome compare-and-swap: only the exact, live claim commits; stale,
//! forged, expired and racing writers conflict and change nothing; identical
//! dead-letter replays answer the same; overflow is an invalid record.

use settled::domain::LeaseToken;
use settled::domain::{
    RetryPolicy, Route, SettlementFailureCode, SettlementSkipReason, StoreErrorClass,
};
use settled::store::ReceiptState;

use super::support::*;
use crate::common::{Fresh, raw_exec};

async fn every_tampered_or_expired_claim_conflicts_and_changes_nothing(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let good = claim(&fresh, "r", "w1", T0, 1_000).await;
    let until = good.lease_until_ms.get();
    let mut forged = Vec::new();
    forged.push(("forged token", {
        let mut c = good.clone();
        c.claim.lease_token = LeaseToken::parse(&"0".repeat(32)).unwrap();
        c
    }));
    forged.push(("wrong owner", {
        let mut c = good.clone();
        c.claim.lease_owner = worker("w2");
        c
    }));
    forged.push(("newer version", {
        let mut c = good.clone();
        c.claim.row_version += 1;
        c
    }));
    forged.push(("older version", {
        let mut c = good.clone();
        c.claim.row_version -= 1;
        c
    }));
    forged.push(("wrong attempts", {
        let mut c = good.clone();
        c.claim.attempts += 1;
        c
    }));
    forged.push(("wrong finalized_at", {
        let mut c = good.clone();
        c.claim.finalized_at += 1;
        c
    }));
    forged.push(("later deadline", {
        let mut c = good.clone();
        c.claim.lease_until_ms += 5_000;
        c
    }));
    forged.push(("earlier deadline", {
        let mut c = good.clone();
        c.claim.lease_until_ms -= 1;
        c
    }));
    forged.push(("other receipt", {
        let mut c = good.clone();
        c.claim.receipt_id = rid("nope");
        c
    }));
    let outcomes = [
        accepted("t"),
        skipped(SettlementSkipReason::Denied),
        rpc("boom"),
        permanent(SettlementFailureCode::Verification, "bad"),
    ];
    let before = view(&fresh, "r", T0).await;
    for outcome in &outcomes {
        for (what, bad) in &forged {
            let result = record(&fresh, bad, outcome, RetryPolicy::default(), T0 + 10).await;
            assert_conflict(&result);
            assert_eq!(
                view(&fresh, "r", T0).await,
                before,
                "{what} changed the receipt"
            );
        }
        // The genuine claim, observed at or after the deadline, is expired.
        for at in [until, until + 1] {
            assert_conflict(&record(&fresh, &good, outcome, RetryPolicy::default(), at).await);
            assert_eq!(view(&fresh, "r", T0).await, before);
        }
    }
    // One millisecond before the deadline it is still live.
    let route = record(
        &fresh,
        &good,
        &accepted("t"),
        RetryPolicy::default(),
        until - 1,
    )
    .await;
    assert_eq!(route.unwrap(), Route::NoAction);
}

async fn a_superseded_claim_conflicts(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let old = claim(&fresh, "r", "w1", T0, 100).await;
    let new = claim(&fresh, "r", "w2", T0 + 100, 100).await;
    assert_eq!(new.row_version.get(), old.row_version + 1);
    let before = view(&fresh, "r", T0 + 100).await;
    // Whether observed before its own deadline or after it, the old claim lost.
    for at in [T0 + 99, T0 + 150] {
        assert_conflict(&record(&fresh, &old, &accepted("t"), RetryPolicy::default(), at).await);
        assert_conflict(&record(&fresh, &old, &rpc("x"), RetryPolicy::default(), at).await);
    }
    assert_eq!(view(&fresh, "r", T0 + 100).await, before);
    let route = record(
        &fresh,
        &new,
        &accepted("t2"),
        RetryPolicy::default(),
        T0 + 150,
    )
    .await;
    assert_eq!(route.unwrap(), Route::NoAction);
    assert_eq!(
        view(&fresh, "r", T0 + 150).await.transcript_id.as_deref(),
        Some("t2")
    );
}

async fn an_identical_dead_letter_replay_answers_the_same(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w1", T0, 1_000).await;
    let decision = permanent(SettlementFailureCode::Signature, "bad sig");
    let policy = RetryPolicy::default();
    let first = record(&fresh, &c, &decision, policy, T0 + 1).await.unwrap();
    assert_eq!(first, Route::DeadLettered { attempts: 1 });
    let after = view(&fresh, "r", T0 + 1).await;
    // Same code, digest and attempts: same answer, live lease or not.
    for at in [T0 + 2, c.lease_until_ms.get(), T0 + 999_999] {
        assert_eq!(
            record(&fresh, &c, &decision, policy, at).await.unwrap(),
            first
        );
        // A retryable report of the same failure code is the same dead-letter decision.
        let same = retryable(SettlementFailureCode::Signature, "bad sig");
        assert_eq!(record(&fresh, &c, &same, policy, at).await.unwrap(), first);
    }
    let mut other_attempts = c.clone();
    other_attempts.claim.attempts += 1;
    let different = [
        (
            c.clone(),
            permanent(SettlementFailureCode::Verification, "bad sig"),
        ),
        (
            c.clone(),
            permanent(SettlementFailureCode::Signature, "other detail"),
        ),
        (other_attempts, decision.clone()),
        (c.clone(), accepted("t")),
        (c.clone(), skipped(SettlementSkipReason::ZeroCharge)),
        (c.clone(), rpc("bad sig")),
    ];
    for (claim, outcome) in &different {
        assert_conflict(&record(&fresh, claim, outcome, policy, T0 + 2).await);
    }
    assert_eq!(
        view(&fresh, "r", T0 + 1).await,
        after,
        "replays changed nothing"
    );
}

/// Found by the fault harness: the replay rule answered a *late* commit
/// with the route, when another worker had claimed the receipt after the
/// first lease lapsed and dead-lettered it with the same failure.
async fn the_same_dead_letter_under_an_earlier_lapsed_claim_is_a_conflict(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let first = claim(&fresh, "r", "w1", T0, 1_000).await;
    // w1's lease lapses; w2 claims the receipt and dead-letters it.
    let second = claim(&fresh, "r", "w2", T0 + 1_000, 1_000).await;
    assert_eq!(second.attempts, first.attempts);
    let decision = permanent(SettlementFailureCode::Signature, "bad sig");
    let policy = RetryPolicy::default();
    let route = record(&fresh, &second, &decision, policy, T0 + 1_001)
        .await
        .unwrap();
    assert_eq!(route, Route::DeadLettered { attempts: 1 });
    // w1, late, reports the very same failure: its lease was lost, refused...
    assert_conflict(&record(&fresh, &first, &decision, policy, T0 + 1_002).await);
    // ...while w2's resend after a lost answer still gets its route.
    assert_eq!(
        record(&fresh, &second, &decision, policy, T0 + 1_003)
            .await
            .unwrap(),
        route
    );
    assert_eq!(view(&fresh, "r", T0 + 1_003).await.history.len(), 1);
}

async fn a_replay_after_retries_matches_the_total_attempts(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let policy = RetryPolicy::new(2, 250, 2, 60_000).unwrap();
    let mut now = T0;
    for _ in 0..2 {
        let c = claim(&fresh, "r", "w", now, 1_000).await;
        let Route::RetryScheduled {
            next_visible_at_ms, ..
        } = record(&fresh, &c, &rpc("down"), policy, now).await.unwrap()
        else {
            panic!("expected a retry")
        };
        now = next_visible_at_ms;
    }
    let last = claim(&fresh, "r", "w", now, 1_000).await;
    assert_eq!(last.attempts, 2);
    let route = record(&fresh, &last, &rpc("down"), policy, now)
        .await
        .unwrap();
    assert_eq!(route, Route::DeadLettered { attempts: 3 });
    assert_eq!(
        record(&fresh, &last, &rpc("down"), policy, now + 5_000)
            .await
            .unwrap(),
        route
    );
    let mut earlier = last.clone();
    earlier.claim.attempts = 1;
    assert_conflict(&record(&fresh, &earlier, &rpc("down"), policy, now).await);
    assert_eq!(view(&fresh, "r", now).await.history.len(), 3);
}

async fn finished_receipts_refuse_any_outcome(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("settled"), receipt("skipped")], T0).await;
    let policy = RetryPolicy::default();
    let a = claim(&fresh, "settled", "w", T0, 1_000).await;
    record(&fresh, &a, &accepted("t"), policy, T0 + 1)
        .await
        .unwrap();
    let b = claim(&fresh, "skipped", "w", T0, 1_000).await;
    record(
        &fresh,
        &b,
        &skipped(SettlementSkipReason::Denied),
        policy,
        T0 + 1,
    )
    .await
    .unwrap();
    let views = [
        view(&fresh, "settled", T0).await,
        view(&fresh, "skipped", T0).await,
    ];
    let outcomes = [
        accepted("t"),
        skipped(SettlementSkipReason::Denied),
        rpc("x"),
        permanent(SettlementFailureCode::Rpc, "x"),
    ];
    for c in [&a, &b] {
        for outcome in &outcomes {
            assert_conflict(&record(&fresh, c, outcome, policy, T0 + 2).await);
        }
    }
    assert_eq!(
        [
            view(&fresh, "settled", T0).await,
            view(&fresh, "skipped", T0).await
        ],
        views
    );
}

async fn attempts_overflow_is_refused_and_changes_nothing(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    raw_exec(
        &fresh,
        "UPDATE receipts SET attempts = 4294967295 WHERE receipt_id = 'r'",
    )
    .await
    .unwrap();
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    assert_eq!(c.attempts, u32::MAX);
    let before = view(&fresh, "r", T0 + 1).await;
    assert_eq!(
        (before.state, before.attempts),
        (ReceiptState::Leased, u32::MAX)
    );
    let big = RetryPolicy::new(32, 250, 2, 60_000).unwrap();
    for outcome in [rpc("x"), permanent(SettlementFailureCode::Signature, "x")] {
        for policy in [RetryPolicy::default(), big] {
            assert_invalid(&record(&fresh, &c, &outcome, policy, T0 + 1).await);
        }
    }
    assert_eq!(
        view(&fresh, "r", T0 + 1).await,
        before,
        "row is still leased and unchanged"
    );
}

async fn retry_deadline_overflow_is_refused(fresh: Fresh) {
    // The lease may run to the very end of the clock; a retry after it may not.
    enqueue_new(&fresh, &[receipt("r")], 0).await;
    let now = i64::MAX as u64 - 1_000;
    let c = claim(&fresh, "r", "w", now, 1_000).await;
    assert_eq!(c.lease_until_ms.get(), i64::MAX as u64);
    let before = view(&fresh, "r", now).await;
    // Observed 100 ms before the end of the clock: a 250 ms wait does not fit.
    assert_invalid(&record(&fresh, &c, &rpc("x"), RetryPolicy::default(), now + 900).await);
    assert_eq!(view(&fresh, "r", now).await, before);
    let dead_letter = permanent(SettlementFailureCode::Rpc, "x");
    let route = record(&fresh, &c, &dead_letter, RetryPolicy::default(), now + 900).await;
    assert_eq!(route.unwrap(), Route::DeadLettered { attempts: 1 });
}

async fn racing_terminal_writers_have_exactly_one_winner(fresh: Fresh) {
    let ids: Vec<String> = (0..4).map(|i| format!("race-{i}")).collect();
    enqueue_new(
        &fresh,
        &ids.iter().map(|id| receipt(id)).collect::<Vec<_>>(),
        T0,
    )
    .await;
    for id in &ids {
        let c = claim(&fresh, id, "w", T0, 60_000).await;
        let mut tasks = Vec::new();
        for n in 0..16 {
            let (s, c) = (fresh.store.clone(), c.clone());
            let outcome = match n % 4 {
                0 => accepted(&format!("tx-{n}")),
                1 => permanent(SettlementFailureCode::Signature, &format!("sig {n}")),
                2 => rpc(&format!("rpc {n}")),
                _ => permanent(SettlementFailureCode::Rpc, &format!("perm {n}")),
            };
            tasks.push(tokio::spawn(async move {
                s.record_claimed_outcome(&c, &outcome, RetryPolicy::default(), ms(T0 + 1))
                    .await
            }));
        }
        let mut wins = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => wins += 1,
                Err(e) => assert_eq!(e.class(), StoreErrorClass::Conflict, "{e}"),
            }
        }
        assert_eq!(wins, 1, "exactly one writer wins for {id}");
        assert_eq!(view(&fresh, id, T0 + 1).await.history.len(), 1);
    }
}

crate::on_every_backend!(
    every_tampered_or_expired_claim_conflicts_and_changes_nothing,
    a_superseded_claim_conflicts,
    an_identical_dead_letter_replay_answers_the_same,
    the_same_dead_letter_under_an_earlier_lapsed_claim_is_a_conflict,
    a_replay_after_retries_matches_the_total_attempts,
    finished_receipts_refuse_any_outcome,
    attempts_overflow_is_refused_and_changes_nothing,
    retry_deadline_overflow_is_refused,
    racing_terminal_writers_have_exactly_one_winner,
);
