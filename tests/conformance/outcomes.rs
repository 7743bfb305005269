//! Routing outcomes: settle, skip, retry with backoff, dead-letter, the
//! retry policy, and batches of outcomes.

use settled::domain::LeaseToken;
use settled::domain::{
    Outcome, RetryPolicy, Route, SettlementFailureCode, SettlementFailureReason,
    SettlementSkipReason, StoreErrorClass,
};
use settled::store::{HistoryEntry, ReceiptState};

use super::support::*;
use crate::common::Fresh;

async fn accepted_settles_with_its_transcript(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w1", T0, 1_000).await;
    let route = record(
        &fresh,
        &c,
        &accepted("tx-42"),
        RetryPolicy::default(),
        T0 + 5,
    )
    .await;
    assert_eq!(route.unwrap(), Route::NoAction);
    let v = view(&fresh, "r", T0 + 5).await;
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Settled, 0, 1)
    );
    assert_eq!(v.transcript_id.as_deref(), Some("tx-42"));
    assert_eq!((v.next_visible_at_ms, v.lease.is_none()), (None, true));
    let entry = HistoryEntry {
        attempt: 1,
        outcome: "accepted".into(),
        code: None,
        detail_sha256: None,
        rail_code: None,
        transcript_id: Some("tx-42".into()),
        reason: None,
        worker_id: "w1".into(),
        observed_at_ms: T0 + 5,
        route: Some("no_action".into()),
        actor: None,
        note: None,
        retry_after_ms: None,
    };
    assert_eq!(v.history, [entry]);
    assert!(
        try_claim(&fresh, "r", "w2", T0 + 10_000, 10)
            .await
            .is_ok_and(|c| c == settled::store::ReceiptClaim::NoActiveWork)
    );
}

async fn skipped_keeps_its_reason(fresh: Fresh) {
    for (n, reason) in SettlementSkipReason::ALL.into_iter().enumerate() {
        let id = format!("r{n}");
        enqueue_new(&fresh, &[receipt(&id)], T0).await;
        let c = claim(&fresh, &id, "w", T0, 1_000).await;
        let route = record(&fresh, &c, &skipped(reason), RetryPolicy::default(), T0 + 1).await;
        assert_eq!(route.unwrap(), Route::NoAction);
        let v = view(&fresh, &id, T0 + 1).await;
        assert_eq!(
            (v.state, v.skip_reason),
            (ReceiptState::Skipped, Some(reason))
        );
        assert_eq!(v.history.len(), 1);
        assert_eq!(
            (v.history[0].outcome.as_str(), v.history[0].reason),
            ("skipped", Some(reason))
        );
    }
}

async fn rpc_failures_back_off_then_dead_letter_on_the_sixth(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let policy = RetryPolicy::default();
    let mut due = T0;
    let waits = [250, 500, 1_000, 2_000, 4_000];
    for (n, wait) in (1u32..).zip(waits) {
        let c = claim(&fresh, "r", "w", due, 10_000).await;
        assert_eq!((c.attempts, c.row_version.get()), (n - 1, u64::from(n)));
        let observed = due + 7;
        let route = record(&fresh, &c, &rpc(&format!("timeout {n}")), policy, observed)
            .await
            .unwrap();
        let next = observed + wait;
        assert_eq!(
            route,
            Route::RetryScheduled {
                attempt: n,
                next_visible_at_ms: next
            }
        );
        let v = view(&fresh, "r", next - 1).await;
        assert_eq!(
            (v.state, v.attempts, v.row_version),
            (ReceiptState::RetryScheduled, n, u64::from(n))
        );
        assert_eq!(v.next_visible_at_ms, Some(next));
        assert!(v.lease.is_none(), "the lease is cleared");
        let failure = v.last_failure.expect("last failure");
        assert_eq!(failure.code, SettlementFailureCode::Rpc);
        assert_eq!(failure.detail_sha256, sha256_hex(&format!("timeout {n}")));
        let early = try_claim(&fresh, "r", "w", next - 1, 10).await.unwrap();
        assert_eq!(early, settled::store::ReceiptClaim::NotYetVisible);
        due = next;
    }
    let c = claim(&fresh, "r", "w", due, 10_000).await;
    let route = record(&fresh, &c, &rpc("timeout 6"), policy, due + 1)
        .await
        .unwrap();
    assert_eq!(route, Route::DeadLettered { attempts: 6 });
    let v = view(&fresh, "r", due + 1).await;
    assert_eq!(
        (v.state, v.attempts, v.next_visible_at_ms),
        (ReceiptState::DeadLettered, 6, None)
    );
    let letter = v.dead_letter.expect("dead letter");
    assert_eq!(
        (letter.attempts, letter.code, letter.dead_lettered_at_ms),
        (6, SettlementFailureCode::Rpc, due + 1)
    );
    let attempts: Vec<u32> = v.history.iter().map(|h| h.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4, 5, 6]);
    let routes: Vec<_> = v.history.iter().map(|h| h.route.clone().unwrap()).collect();
    assert_eq!(routes[..5], ["retry_scheduled"; 5]);
    assert_eq!(routes[5], "dead_lettered");
}

async fn only_rpc_and_backend_are_ever_retried(fresh: Fresh) {
    let policy = RetryPolicy::default();
    for (n, code) in SettlementFailureCode::ALL.into_iter().enumerate() {
        let (retry_id, perm_id) = (format!("retry-{n}"), format!("perm-{n}"));
        enqueue_new(&fresh, &[receipt(&retry_id), receipt(&perm_id)], T0).await;
        let c = claim(&fresh, &retry_id, "w", T0, 1_000).await;
        let route = record(&fresh, &c, &retryable(code, "x"), policy, T0 + 3)
            .await
            .unwrap();
        let expected = if matches!(
            code,
            SettlementFailureCode::Rpc | SettlementFailureCode::Backend
        ) {
            Route::RetryScheduled {
                attempt: 1,
                next_visible_at_ms: T0 + 253,
            }
        } else {
            Route::DeadLettered { attempts: 1 }
        };
        assert_eq!(route, expected, "retryable {}", code.as_str());
        let c = claim(&fresh, &perm_id, "w", T0, 1_000).await;
        let route = record(&fresh, &c, &permanent(code, "x"), policy, T0 + 3)
            .await
            .unwrap();
        assert_eq!(
            route,
            Route::DeadLettered { attempts: 1 },
            "permanent {}",
            code.as_str()
        );
        let letter = store(&fresh)
            .dead_letter(&rid(&perm_id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((letter.code, letter.attempts), (code, 1));
    }
}

async fn the_policy_decides_retries_and_waits(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("zero"), receipt("custom")], T0).await;
    let no_retries = RetryPolicy::new(0, 250, 2, 60_000).unwrap();
    let c = claim(&fresh, "zero", "w", T0, 1_000).await;
    let route = record(&fresh, &c, &rpc("x"), no_retries, T0).await.unwrap();
    assert_eq!(route, Route::DeadLettered { attempts: 1 });
    assert_eq!(view(&fresh, "zero", T0).await.attempts, 1);

    let custom = RetryPolicy::new(4, 100, 3, 500).unwrap();
    let mut now = T0;
    for (n, wait) in (1u32..).zip([100, 300, 500, 500]) {
        let c = claim(&fresh, "custom", "w", now, 1_000).await;
        let route = record(&fresh, &c, &rpc("x"), custom, now).await.unwrap();
        assert_eq!(
            route,
            Route::RetryScheduled {
                attempt: n,
                next_visible_at_ms: now + wait
            }
        );
        now += wait;
    }
    let c = claim(&fresh, "custom", "w", now, 1_000).await;
    assert_eq!(
        record(&fresh, &c, &rpc("x"), custom, now).await.unwrap(),
        Route::DeadLettered { attempts: 5 }
    );
}

async fn a_batch_of_outcomes_is_judged_item_by_item(fresh: Fresh) {
    let ids = ["a", "b", "c", "d"];
    enqueue_new(&fresh, &ids.map(receipt), T0).await;
    let claims = store(&fresh)
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(4))
        .await
        .unwrap();
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| claims[i].clone());
    let mut forged_b = b.clone();
    forged_b.claim.lease_token = LeaseToken::parse(&"f".repeat(32)).unwrap();
    let batch = vec![
        (a.clone(), accepted("ta")),
        (forged_b, accepted("tb")),
        (c.clone(), rpc("x")),
        (a.clone(), skipped(SettlementSkipReason::Denied)),
        (
            d.clone(),
            permanent(SettlementFailureCode::Unsupported, "no"),
        ),
    ];
    let results = store(&fresh)
        .record_claimed_outcomes(&leases(batch), RetryPolicy::default(), ms(T0 + 10))
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0], Ok(Route::NoAction));
    assert_eq!(
        results[1].as_ref().unwrap_err().class(),
        StoreErrorClass::Conflict
    );
    assert_eq!(
        results[2],
        Ok(Route::RetryScheduled {
            attempt: 1,
            next_visible_at_ms: T0 + 260
        })
    );
    assert_eq!(
        results[3].as_ref().unwrap_err().class(),
        StoreErrorClass::Conflict
    );
    assert_eq!(results[4], Ok(Route::DeadLettered { attempts: 1 }));
    let states = [
        ("a", ReceiptState::Settled),
        ("b", ReceiptState::Leased),
        ("c", ReceiptState::RetryScheduled),
        ("d", ReceiptState::DeadLettered),
    ];
    for (id, expected) in states {
        assert_eq!(state(&fresh, id, T0 + 10).await, expected, "{id}");
    }
    assert!(
        store(&fresh)
            .record_claimed_outcomes(&[], RetryPolicy::default(), ms(T0))
            .await
            .unwrap()
            .is_empty()
    );
    // The item refused in the batch still holds its lease and can commit.
    let route = record(&fresh, &b, &accepted("tb"), RetryPolicy::default(), T0 + 11).await;
    assert_eq!(route.unwrap(), Route::NoAction);
    assert_eq!(view(&fresh, "c", T0 + 11).await.attempts, 1);
    assert_eq!(c.attempts, 0);
}

/// A write the database refuses (as in the next test) in a batch larger
/// than one statement of the SQLite writer (256 rows), the refused item in
/// its last statement: it fails alone, and the items of the earlier
/// statements are recorded once, not refused as conflicts.
async fn a_refused_write_in_a_large_batch_fails_that_item_alone(fresh: Fresh) {
    let ids: Vec<String> = (0..300).map(|i| format!("r{i:03}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let claims = store(&fresh)
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(300))
        .await
        .unwrap();
    assert_eq!(claims.len(), 300);
    plant_refusal(&fresh, "r299").await;
    let batch = claims
        .into_iter()
        .map(|c| (c, accepted("t")))
        .collect::<Vec<_>>();
    let results = store(&fresh)
        .record_claimed_outcomes(&leases(batch), RetryPolicy::default(), ms(T0 + 1))
        .await
        .unwrap();
    let refused: Vec<usize> = (0..300).filter(|&i| results[i].is_err()).collect();
    assert_eq!(refused, [299], "{:?}", results.iter().find(|r| r.is_err()));
    assert_invalid(&results[299]);
    for id in ["r000", "r255", "r256", "r298"] {
        let v = view(&fresh, id, T0 + 1).await;
        assert_eq!(
            (v.state, v.history.len()),
            (ReceiptState::Settled, 1),
            "{id}"
        );
    }
    assert_eq!(state(&fresh, "r299", T0 + 1).await, ReceiptState::Leased);
}

/// A write the database refuses (a CHECK, as a corrupt row meets it) fails
/// that item alone: the other outcomes of the batch are recorded as they
/// would be without it (history included), and the refused receipt keeps
/// its lease, unchanged, to be committed or released later.
async fn a_write_the_database_refuses_fails_that_item_alone(fresh: Fresh) {
    let ids = ["a", "bad", "c"];
    enqueue_new(&fresh, &ids.map(receipt), T0).await;
    let claims = store(&fresh)
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(3))
        .await
        .unwrap();
    let [a, bad, c] = [0, 1, 2].map(|i| claims[i].clone());
    assert_eq!(bad.claim.receipt_id.as_str(), "bad");
    plant_refusal(&fresh, "bad").await;
    let before = view(&fresh, "bad", T0 + 1).await;
    let batch = vec![
        (a, accepted("ta")),
        (bad.clone(), accepted("tbad")),
        (c, rpc("x")),
    ];
    let results = store(&fresh)
        .record_claimed_outcomes(&leases(batch), RetryPolicy::default(), ms(T0 + 1))
        .await
        .unwrap();
    assert_eq!(results[0], Ok(Route::NoAction));
    assert_invalid(&results[1]);
    assert_eq!(
        results[2],
        Ok(Route::RetryScheduled {
            attempt: 1,
            next_visible_at_ms: T0 + 251
        })
    );
    let settled = view(&fresh, "a", T0 + 1).await;
    assert_eq!(settled.state, ReceiptState::Settled);
    assert_eq!(settled.history.len(), 1);
    let retried = view(&fresh, "c", T0 + 1).await;
    assert_eq!(
        (retried.state, retried.attempts, retried.history.len()),
        (ReceiptState::RetryScheduled, 1, 1)
    );
    assert_eq!(view(&fresh, "bad", T0 + 1).await, before);
    assert_eq!(before.state, ReceiptState::Leased);
    // Its lease still holds: a release by the same claim is taken.
    store(&fresh)
        .release_lease(&bad.claim, ms(T0 + 2))
        .await
        .unwrap();
    assert_eq!(state(&fresh, "bad", T0 + 2).await, ReceiptState::Pending);
    // The counts moved for what was written, and only for that.
    let counts = store(&fresh).status(ms(T0 + 2), 3).await.unwrap().counts;
    let expected = [
        (ReceiptState::Pending, 1),
        (ReceiptState::Leased, 0),
        (ReceiptState::RetryScheduled, 1),
        (ReceiptState::Settled, 1),
    ];
    for (state, n) in expected {
        assert_eq!(counts.get(state), n, "{state:?}");
    }
}

async fn a_rails_retry_after_lengthens_the_wait_up_to_the_cap(fresh: Fresh) {
    let ids = ["one", "short", "long", "huge", "last"];
    enqueue_new(&fresh, &ids.map(receipt), T0).await;
    let policy = RetryPolicy::default(); // first backoff 250 ms, cap 60 s
    let after = |ms: u64| Outcome::Retryable {
        reason: SettlementFailureReason::new(SettlementFailureCode::Rpc, "429"),
        retry_after_ms: Some(ms),
    };
    // One outcome alone.
    let c = claim(&fresh, "one", "w", T0, 1_000).await;
    let route = record(&fresh, &c, &after(7_000), policy, T0 + 1).await;
    let at = |attempt, next| Route::RetryScheduled {
        attempt,
        next_visible_at_ms: next,
    };
    assert_eq!(route.unwrap(), at(1, T0 + 7_001));
    // A batch: shorter than the backoff, longer, beyond the cap.
    let mut claims = Vec::new();
    for id in ["short", "long", "huge"] {
        claims.push(claim(&fresh, id, "w", T0, 1_000).await);
    }
    let batch = vec![
        (claims[0].clone(), after(10)),
        (claims[1].clone(), after(30_000)),
        (claims[2].clone(), after(u64::from(u32::MAX))),
    ];
    let results = store(&fresh)
        .record_claimed_outcomes(&leases(batch), policy, ms(T0 + 2))
        .await
        .unwrap();
    assert_eq!(
        results,
        [
            Ok(at(1, T0 + 2 + 250)),
            Ok(at(1, T0 + 2 + 30_000)),
            Ok(at(1, T0 + 2 + 60_000)),
        ]
    );
    // The history keeps what the worker reported, not the wait chosen.
    for (id, reported) in [("one", 7_000), ("short", 10), ("long", 30_000)] {
        let history = view(&fresh, id, T0 + 3).await.history;
        assert_eq!(history.len(), 1, "{id}");
        assert_eq!(history[0].retry_after_ms, Some(reported), "{id}");
    }
    let huge = view(&fresh, "huge", T0 + 3).await;
    assert_eq!(huge.history[0].retry_after_ms, Some(u64::from(u32::MAX)));
    assert_eq!(huge.next_visible_at_ms, Some(T0 + 2 + 60_000));
    // Out of retries, the receipt is dead-lettered at once; the entry still
    // shows the rail's wait.
    let none_left = RetryPolicy::new(0, 250, 2, 60_000).unwrap();
    let c = claim(&fresh, "last", "w", T0, 1_000).await;
    let route = record(&fresh, &c, &after(5_000), none_left, T0 + 4).await;
    assert_eq!(route.unwrap(), Route::DeadLettered { attempts: 1 });
    let last = view(&fresh, "last", T0 + 4).await;
    assert_eq!(last.history[0].retry_after_ms, Some(5_000));
    // Without it, nothing is recorded.
    let rpc_entry = {
        enqueue_new(&fresh, &[receipt("plain")], T0).await;
        let c = claim(&fresh, "plain", "w", T0, 1_000).await;
        record(&fresh, &c, &rpc("x"), policy, T0 + 5).await.unwrap();
        view(&fresh, "plain", T0 + 5).await.history.remove(0)
    };
    assert_eq!(rpc_entry.retry_after_ms, None);
}

/// A failure's rail code is kept with the failure, one by one and in a
/// batch: on the receipt until the next failure replaces it, and in the
/// failure's history entry and dead letter for good.
async fn a_rail_code_stays_with_its_failure(fresh: Fresh) {
    use settled::domain::RailCode;
    let with_rail = |outcome: Outcome, rail: &str| match outcome {
        Outcome::Retryable {
            reason,
            retry_after_ms,
        } => Outcome::Retryable {
            reason: reason.with_rail_code(Some(RailCode::parse(rail).unwrap())),
            retry_after_ms,
        },
        Outcome::Permanent { reason } => Outcome::Permanent {
            reason: reason.with_rail_code(Some(RailCode::parse(rail).unwrap())),
        },
        other => other,
    };
    enqueue_new(&fresh, &[receipt("a"), receipt("b"), receipt("c")], T0).await;
    let a = claim(&fresh, "a", "w", T0, 1_000).await;
    let route = record(
        &fresh,
        &a.claim,
        &with_rail(rpc("timeout"), "issuer:91"),
        RetryPolicy::default(),
        T0 + 1,
    )
    .await;
    assert!(
        matches!(route, Ok(Route::RetryScheduled { .. })),
        "{route:?}"
    );
    let b = claim(&fresh, "b", "w", T0, 1_000).await;
    let c = claim(&fresh, "c", "w", T0, 1_000).await;
    let declined = permanent(SettlementFailureCode::Verification, "51");
    let batch = vec![
        (b, with_rail(declined.clone(), "card_declined")),
        (c, declined),
    ];
    let routes = store(&fresh)
        .record_claimed_outcomes(&leases(batch), RetryPolicy::default(), ms(T0 + 2))
        .await
        .unwrap();
    assert!(
        routes
            .iter()
            .all(|r| matches!(r, Ok(Route::DeadLettered { .. }))),
        "{routes:?}"
    );

    let rail =
        |v: &settled::store::ReceiptView| v.last_failure.as_ref().and_then(|f| f.rail_code.clone());
    let va = view(&fresh, "a", T0 + 2).await;
    assert_eq!(rail(&va).as_deref(), Some("issuer:91"));
    assert_eq!(va.history[0].rail_code.as_deref(), Some("issuer:91"));
    let vb = view(&fresh, "b", T0 + 2).await;
    assert_eq!(rail(&vb).as_deref(), Some("card_declined"));
    assert_eq!(vb.history[0].rail_code.as_deref(), Some("card_declined"));
    let letter = store(&fresh).dead_letter(&rid("b")).await.unwrap().unwrap();
    assert_eq!(
        letter.last_failure.rail_code.as_deref(),
        Some("card_declined")
    );
    let vc = view(&fresh, "c", T0 + 2).await;
    assert_eq!((rail(&vc), vc.history[0].rail_code.clone()), (None, None));

    // Settled after the retry: the last failure keeps its rail code.
    let due = va.next_visible_at_ms.unwrap();
    let again = claim(&fresh, "a", "w", due, 1_000).await;
    record(
        &fresh,
        &again.claim,
        &accepted("tx"),
        RetryPolicy::default(),
        due + 1,
    )
    .await
    .unwrap();
    let va = view(&fresh, "a", due + 1).await;
    assert_eq!(rail(&va).as_deref(), Some("issuer:91"));
    assert_eq!(va.history[1].rail_code, None);
}

crate::on_every_backend!(
    a_rail_code_stays_with_its_failure,
    accepted_settles_with_its_transcript,
    skipped_keeps_its_reason,
    rpc_failures_back_off_then_dead_letter_on_the_sixth,
    only_rpc_and_backend_are_ever_retried,
    the_policy_decides_retries_and_waits,
    a_batch_of_outcomes_is_judged_item_by_item,
    a_write_the_database_refuses_fails_that_item_alone,
    a_refused_write_in_a_large_batch_fails_that_item_alone,
    a_rails_retry_after_lengthens_the_wait_up_to_the_cap,
);
