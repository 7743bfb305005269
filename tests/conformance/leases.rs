//! Lease extension (heartbeat) and release, both under the claim CAS.

use settled::domain::{LeaseToken, U63, UnixMs};
use settled::domain::{RetryPolicy, Route, SettlementFailureCode};
use settled::store::{ReceiptClaim, ReceiptState};

use super::support::*;
use crate::common::Fresh;

async fn extend_moves_the_deadline_and_keeps_token_and_version(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    let extended = s
        .extend_lease(&c, lease(5_000), ms(T0 + 900))
        .await
        .unwrap();
    assert_eq!(extended.lease_until_ms.get(), T0 + 5_900);
    let mut expected = c.clone();
    expected.claim.lease_until_ms = U63::try_from(T0 + 5_900).unwrap();
    assert_eq!(
        extended, expected,
        "same token, owner, version and attempts"
    );
    let v = view(&fresh, "r", T0 + 1_000).await;
    assert_eq!((v.state, v.row_version), (ReceiptState::Leased, 1));
    assert_eq!(v.lease.unwrap().until_ms, T0 + 5_900);
    assert_eq!(
        try_claim(&fresh, "r", "x", T0 + 5_899, 10).await.unwrap(),
        ReceiptClaim::Leased
    );
    // The claim as it was before the extension no longer matches.
    assert_conflict(&record(&fresh, &c, &accepted("t"), RetryPolicy::default(), T0 + 950).await);
    // An extension may also shorten the lease.
    let shorter = s
        .extend_lease(&extended, lease(10), ms(T0 + 1_000))
        .await
        .unwrap();
    assert_eq!(shorter.lease_until_ms.get(), T0 + 1_010);
    let route = record(
        &fresh,
        &shorter,
        &accepted("t"),
        RetryPolicy::default(),
        T0 + 1_009,
    )
    .await;
    assert_eq!(route.unwrap(), Route::NoAction);
}

async fn extend_is_refused_for_expired_stale_or_finished_claims(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r"), receipt("done")], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    let before = view(&fresh, "r", T0).await;
    assert_conflict(&s.extend_lease(&c, lease(1_000), ms(T0 + 1_000)).await);
    assert_conflict(&s.extend_lease(&c, lease(1_000), ms(T0 + 1_001)).await);
    let mut forged = c.clone();
    forged.claim.lease_token = LeaseToken::parse(&"a".repeat(32)).unwrap();
    assert_conflict(&s.extend_lease(&forged, lease(1_000), ms(T0 + 1)).await);
    let mut wrong_version = c.clone();
    wrong_version.claim.row_version = U63::from(7_u32);
    assert_conflict(
        &s.extend_lease(&wrong_version, lease(1_000), ms(T0 + 1))
            .await,
    );
    assert_eq!(view(&fresh, "r", T0).await, before);
    // Reclaimed by someone else: the old claim is stale even if observed early.
    let newer = claim(&fresh, "r", "w2", T0 + 1_000, 1_000).await;
    assert_conflict(&s.extend_lease(&c, lease(1_000), ms(T0 + 500)).await);
    assert_eq!(
        view(&fresh, "r", T0 + 1_000).await.lease.unwrap().owner,
        "w2"
    );
    let d = claim(&fresh, "done", "w", T0, 1_000).await;
    record(&fresh, &d, &accepted("t"), RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();
    assert_conflict(&s.extend_lease(&d, lease(1_000), ms(T0 + 2)).await);
    // now + extension beyond the database's integers is an invalid record.
    let edge = i64::MAX as u64 - 10;
    let mut far = newer.clone();
    far.claim.lease_until_ms = U63::MAX;
    assert_invalid(&s.extend_lease(&far, lease(11), ms(edge)).await);
    // The clock itself at its end: even a 1 ms extension does not fit.
    assert_invalid(&s.extend_lease(&newer, lease(1), UnixMs::MAX).await);
    assert_eq!(
        view(&fresh, "r", T0 + 1_000).await.lease.unwrap().until_ms,
        T0 + 2_000
    );
}

async fn release_makes_work_due_at_once_without_spending_an_attempt(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt_with("r", FIN, None, Some(T0 - 500))], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    s.release_lease(&c, ms(T0 + 10)).await.unwrap();
    let v = view(&fresh, "r", T0 + 10).await;
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Pending, 0, 1)
    );
    assert_eq!(
        (v.next_visible_at_ms, v.lease.is_none()),
        (Some(T0 + 10), true)
    );
    assert_eq!(v.history.len(), 1);
    let entry = &v.history[0];
    assert_eq!(
        (
            entry.outcome.as_str(),
            entry.attempt,
            entry.worker_id.as_str()
        ),
        ("released", 0, "w")
    );
    assert_eq!(
        (entry.observed_at_ms, entry.route.as_deref()),
        (T0 + 10, None)
    );
    // The released claim is dead: every use of it conflicts.
    assert_conflict(&record(&fresh, &c, &accepted("t"), RetryPolicy::default(), T0 + 11).await);
    assert_conflict(&s.extend_lease(&c, lease(100), ms(T0 + 11)).await);
    assert_conflict(&s.release_lease(&c, ms(T0 + 11)).await);
    assert_eq!(view(&fresh, "r", T0 + 10).await, v);
    let again = s
        .claim_due(&worker("w2"), ms(T0 + 10), lease(100), limit(5))
        .await
        .unwrap();
    assert_eq!(
        (again.len(), again[0].row_version.get(), again[0].attempts),
        (1, 2, 0)
    );
}

async fn release_keeps_the_attempts_of_a_retried_receipt(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    record(&fresh, &c, &rpc("x"), RetryPolicy::default(), T0)
        .await
        .unwrap();
    let c = claim(&fresh, "r", "w", T0 + 250, 1_000).await;
    assert_eq!(c.attempts, 1);
    s.release_lease(&c, ms(T0 + 300)).await.unwrap();
    let v = view(&fresh, "r", T0 + 300).await;
    assert_eq!(
        (v.state, v.attempts, v.next_visible_at_ms),
        (ReceiptState::RetryScheduled, 1, Some(T0 + 300))
    );
    assert_eq!(v.history.last().unwrap().attempt, 1);
    let c = claim(&fresh, "r", "w", T0 + 300, 1_000).await;
    let route = record(&fresh, &c, &rpc("x"), RetryPolicy::default(), T0 + 300)
        .await
        .unwrap();
    assert_eq!(
        route,
        Route::RetryScheduled {
            attempt: 2,
            next_visible_at_ms: T0 + 800
        }
    );
}

async fn release_is_refused_for_expired_or_forged_claims(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    let before = view(&fresh, "r", T0).await;
    assert_conflict(&s.release_lease(&c, ms(T0 + 1_000)).await);
    let mut other = c.clone();
    other.claim.lease_owner = worker("thief");
    assert_conflict(&s.release_lease(&other, ms(T0 + 1)).await);
    let mut wrong = c.clone();
    wrong.claim.finalized_at = U63::try_from(wrong.finalized_at + 1).unwrap();
    assert_conflict(&s.release_lease(&wrong, ms(T0 + 1)).await);
    assert_eq!(view(&fresh, "r", T0).await, before);
    record(
        &fresh,
        &c,
        &permanent(SettlementFailureCode::Backend, "x"),
        RetryPolicy::default(),
        T0 + 1,
    )
    .await
    .unwrap();
    assert_conflict(&s.release_lease(&c, ms(T0 + 2)).await);
}

/// Whether a registered waiter has been woken (polled once, never waits).
async fn woken(waiter: tokio::sync::futures::Notified<'_>) -> bool {
    tokio::time::timeout(std::time::Duration::ZERO, waiter)
        .await
        .is_ok()
}

/// Long-polling workers wait on the notifier: enqueue, release and redrive
/// wake them at once. (Extra wake-ups are allowed: a backend may also relay
/// other replicas' commits, late, so no test says when it must stay quiet.)
async fn work_notifier_signals_new_due_work(fresh: Fresh) {
    let s = store(&fresh);
    let notify = s.work_notifier();
    let waiting = notify.notified();
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    assert!(woken(waiting).await, "enqueue did not wake waiters");

    let c = claim(&fresh, "r", "w", T0, 1_000).await;

    let waiting = notify.notified();
    s.release_lease(&c, ms(T0 + 1)).await.unwrap();
    assert!(woken(waiting).await, "release did not wake waiters");

    let c = claim(&fresh, "r", "w", T0 + 1, 1_000).await;
    let dead = permanent(SettlementFailureCode::Signature, "x");
    record(&fresh, &c, &dead, RetryPolicy::default(), T0 + 2)
        .await
        .unwrap();
    let waiting = notify.notified();
    s.redrive(&rid("r"), ms(T0 + 3)).await.unwrap().unwrap();
    assert!(woken(waiting).await, "redrive did not wake waiters");
    // The redriven receipt is not dead-lettered any more: the old decision
    // is no longer an identical replay.
    assert_conflict(&record(&fresh, &c, &dead, RetryPolicy::default(), T0 + 4).await);
    assert_eq!(state(&fresh, "r", T0 + 4).await, ReceiptState::Pending);
}

/// A claim says whether it took its receipt over from a lease that expired
/// unreported (what `/metrics` counts as a lease expiry), by id and in a
/// batch; a released lease is not an expiry.
async fn a_claim_says_whether_it_took_over_an_expired_lease(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("a"), receipt("b"), receipt("c")], T0).await;
    let first = s
        .claim_due(&worker("w1"), ms(T0), lease(1_000), limit(3))
        .await
        .unwrap();
    assert!(first.iter().all(|c| !c.after_expiry), "fresh receipts");
    let c = first.iter().find(|c| c.receipt_id == "c").unwrap();
    s.release_lease(c, ms(T0 + 1)).await.unwrap();
    let later = T0 + 1_000;
    let by_id = claim(&fresh, "a", "w2", later, 1_000).await;
    assert!(by_id.after_expiry, "a's lease expired");
    let batch = s
        .claim_due(&worker("w2"), ms(later), lease(1_000), limit(3))
        .await
        .unwrap();
    let flags: Vec<_> = batch
        .iter()
        .map(|c| (c.receipt_id.as_str(), c.after_expiry))
        .collect();
    assert_eq!(flags, [("b", true), ("c", false)]);
}

async fn many_leases_extend_at_once_each_judged_on_its_own(fresh: Fresh) {
    let s = store(&fresh);
    let ids: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut claims = Vec::new();
    for id in &ids {
        claims.push(claim(&fresh, id, "w", T0, 1_000).await);
    }
    // Every third claim is stale: its receipt was released and claimed again.
    for c in claims.iter().step_by(3) {
        s.release_lease(&c.claim, ms(T0 + 1)).await.unwrap();
        claim(&fresh, c.claim.receipt_id.as_str(), "x", T0 + 1, 1_000).await;
    }
    let items: Vec<_> = claims
        .iter()
        .map(|c| (c.claim.clone(), lease(4_000)))
        .collect();
    let results = s.extend_leases(&items, ms(T0 + 500)).await;
    assert_eq!(results.len(), ids.len());
    for (i, (result, before)) in results.iter().zip(&claims).enumerate() {
        if i % 3 == 0 {
            assert_conflict(result);
            let v = view(&fresh, &ids[i], T0 + 500).await;
            assert_eq!(
                v.lease.unwrap().owner,
                "x",
                "a refused item changed nothing"
            );
        } else {
            let extended = result.as_ref().unwrap();
            assert_eq!(
                extended.claim.receipt_id, before.claim.receipt_id,
                "in order"
            );
            assert_eq!(extended.lease_until_ms.get(), T0 + 4_500);
            assert_eq!(extended.claim.lease_token, before.claim.lease_token);
            let v = view(&fresh, &ids[i], T0 + 1_200).await;
            assert_eq!(v.lease.unwrap().until_ms, T0 + 4_500);
        }
    }
    // Past the old deadline, the extended claims still commit.
    let extended = results[1].as_ref().unwrap();
    let route = record(
        &fresh,
        extended,
        &accepted("t"),
        RetryPolicy::default(),
        T0 + 4_000,
    )
    .await;
    assert_eq!(route.unwrap(), Route::NoAction);
    assert!(s.extend_leases(&[], ms(T0)).await.is_empty());
}

crate::on_every_backend!(
    many_leases_extend_at_once_each_judged_on_its_own,
    a_claim_says_whether_it_took_over_an_expired_lease,
    extend_moves_the_deadline_and_keeps_token_and_version,
    extend_is_refused_for_expired_stale_or_finished_claims,
    release_makes_work_due_at_once_without_spending_an_attempt,
    release_keeps_the_attempts_of_a_retried_receipt,
    release_is_refused_for_expired_or_forged_claims,
    work_notifier_signals_new_due_work,
);
