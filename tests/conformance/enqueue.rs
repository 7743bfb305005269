//! Enqueueing: created / existing / conflict, identity, visibility, batches.

use serde_json::json;
use settled::domain::RetryPolicy;
use settled::store::{Enqueued, ReceiptState};

use super::support::*;
use crate::common::Fresh;

async fn enqueue_is_created_then_existing_then_conflict(fresh: Fresh) {
    let s = store(&fresh);
    let obs = Some(json!({"amount": 5, "rail": "x"}));
    let first = receipt_with("r1", FIN, obs.clone(), None);
    assert_eq!(
        s.enqueue(std::slice::from_ref(&first), ms(T0))
            .await
            .unwrap(),
        [Enqueued::Created]
    );
    assert_eq!(
        s.enqueue_one(&first, ms(T0 + 5)).await.unwrap(),
        Enqueued::Existing
    );

    let other_fin = receipt_with("r1", FIN + 1, obs.clone(), None);
    let other_obs = receipt_with("r1", FIN, Some(json!({"amount": 6, "rail": "x"})), None);
    let no_obs = receipt_with("r1", FIN, None, None);
    for changed in [other_fin, other_obs, no_obs] {
        assert_eq!(
            s.enqueue_one(&changed, ms(T0 + 9)).await.unwrap(),
            Enqueued::Conflict,
            "{changed:?}"
        );
    }
    // Nothing changed: the first identity stands, still due at its first time.
    let v = view(&fresh, "r1", T0 + 10).await;
    assert_eq!((v.finalized_at, v.observation.clone()), (FIN, obs));
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Pending, 0, 0)
    );
    assert_eq!(v.next_visible_at_ms, Some(T0));
    assert!(v.history.is_empty());
}

async fn identity_ignores_key_order_and_treats_absent_as_null(fresh: Fresh) {
    let s = store(&fresh);
    let a = receipt_with(
        "keys",
        FIN,
        Some(json!({"a": 1, "b": {"c": 2, "d": 3}})),
        None,
    );
    let b = receipt_with(
        "keys",
        FIN,
        Some(json!({"b": {"d": 3, "c": 2}, "a": 1})),
        None,
    );
    assert_eq!(s.enqueue_one(&a, ms(T0)).await.unwrap(), Enqueued::Created);
    assert_eq!(s.enqueue_one(&b, ms(T0)).await.unwrap(), Enqueued::Existing);

    // Absent first, explicit null later, and the other way round.
    let absent = receipt_with("n1", FIN, None, None);
    let null = receipt_with("n1", FIN, Some(json!(null)), None);
    assert_eq!(
        s.enqueue_one(&absent, ms(T0)).await.unwrap(),
        Enqueued::Created
    );
    assert_eq!(
        s.enqueue_one(&null, ms(T0)).await.unwrap(),
        Enqueued::Existing
    );
    let null2 = receipt_with("n2", FIN, Some(json!(null)), None);
    let absent2 = receipt_with("n2", FIN, None, None);
    assert_eq!(
        s.enqueue_one(&null2, ms(T0)).await.unwrap(),
        Enqueued::Created
    );
    assert_eq!(
        s.enqueue_one(&absent2, ms(T0)).await.unwrap(),
        Enqueued::Existing
    );
    // An explicit null is still different from an object.
    let object = receipt_with("n2", FIN, Some(json!({})), None);
    assert_eq!(
        s.enqueue_one(&object, ms(T0)).await.unwrap(),
        Enqueued::Conflict
    );
}

async fn visible_at_is_kept_exactly_and_is_not_identity(fresh: Fresh) {
    let s = store(&fresh);
    let later = receipt_with("later", FIN, None, Some(T0 + 500));
    assert_eq!(
        s.enqueue_one(&later, ms(T0)).await.unwrap(),
        Enqueued::Created
    );
    // Same identity with another (or no) visible_at: existing, visibility unchanged.
    let sooner = receipt_with("later", FIN, None, Some(T0));
    assert_eq!(
        s.enqueue_one(&sooner, ms(T0)).await.unwrap(),
        Enqueued::Existing
    );
    assert_eq!(
        s.enqueue_one(&receipt("later"), ms(T0)).await.unwrap(),
        Enqueued::Existing
    );
    assert_eq!(
        view(&fresh, "later", T0).await.next_visible_at_ms,
        Some(T0 + 500)
    );
    let w = worker("w");
    assert!(
        s.claim_due(&w, ms(T0 + 499), lease(100), limit(10))
            .await
            .unwrap()
            .is_empty()
    );
    let got = s
        .claim_due(&w, ms(T0 + 500), lease(100), limit(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].receipt_id, "later");
}

async fn past_visible_at_is_due_at_once_and_orders_the_queue(fresh: Fresh) {
    let s = store(&fresh);
    let batch = [
        receipt_with("z-now", FIN, None, None),
        receipt_with("y-past", FIN, None, Some(T0 - 1_000)),
        receipt_with("x-past", FIN, None, Some(T0 - 1_000)),
        receipt_with("a-older", FIN, None, Some(5)),
        receipt_with("b-future", FIN, None, Some(T0 + 1)),
    ];
    enqueue_new(&fresh, &batch, T0).await;
    assert_eq!(
        view(&fresh, "a-older", T0).await.next_visible_at_ms,
        Some(5)
    );
    let got = s
        .claim_due(&worker("w"), ms(T0), lease(100), limit(10))
        .await
        .unwrap();
    let ids: Vec<&str> = got.iter().map(|c| c.receipt_id.as_str()).collect();
    assert_eq!(ids, ["a-older", "x-past", "y-past", "z-now"]);
}

async fn finished_work_is_never_resurrected(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[receipt("done"), receipt("dead"), receipt("skip")],
        T0,
    )
    .await;
    let c = claim(&fresh, "done", "w", T0, 1_000).await;
    record(
        &fresh,
        &c,
        &accepted("tx-1"),
        RetryPolicy::default(),
        T0 + 1,
    )
    .await
    .unwrap();
    let c = claim(&fresh, "dead", "w", T0, 1_000).await;
    let perm = permanent(settled::domain::SettlementFailureCode::Signature, "bad");
    record(&fresh, &c, &perm, RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();
    let c = claim(&fresh, "skip", "w", T0, 1_000).await;
    let skip = skipped(settled::domain::SettlementSkipReason::ZeroCharge);
    record(&fresh, &c, &skip, RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();

    let again = [receipt("done"), receipt("dead"), receipt("skip")];
    let results = s.enqueue(&again, ms(T0 + 10)).await.unwrap();
    assert_eq!(results, [Enqueued::Existing; 3]);
    assert_eq!(state(&fresh, "done", T0 + 10).await, ReceiptState::Settled);
    assert_eq!(
        state(&fresh, "dead", T0 + 10).await,
        ReceiptState::DeadLettered
    );
    assert_eq!(state(&fresh, "skip", T0 + 10).await, ReceiptState::Skipped);
    assert!(
        s.claim_due(&worker("w"), ms(T0 + 10), lease(100), limit(10))
            .await
            .unwrap()
            .is_empty()
    );
}

async fn batch_judges_each_receipt_including_duplicates(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("old")], T0).await;
    let batch = [
        receipt("new-1"),
        receipt("old"),
        receipt_with("old", FIN + 7, None, None),
        receipt("new-2"),
        receipt("new-1"),
        receipt_with("new-2", FIN, Some(json!({"k": 1})), None),
    ];
    let results = s.enqueue(&batch, ms(T0 + 1)).await.unwrap();
    use Enqueued::*;
    assert_eq!(
        results,
        [Created, Existing, Conflict, Created, Existing, Conflict]
    );
    let v = view(&fresh, "new-2", T0 + 1).await;
    assert_eq!((v.finalized_at, v.observation), (FIN, None));
    assert_eq!(v.next_visible_at_ms, Some(T0 + 1));
    let claims = s
        .claim_due(&worker("w"), ms(T0 + 1), lease(10), limit(10))
        .await
        .unwrap();
    assert_eq!(claims.len(), 3);
}

async fn new_receipt_starts_pending_with_zero_counters(fresh: Fresh) {
    let obs = json!({"payer": "p", "amount": 12});
    enqueue_new(
        &fresh,
        &[receipt_with("r", FIN, Some(obs.clone()), None)],
        T0,
    )
    .await;
    let v = view(&fresh, "r", T0).await;
    assert_eq!(v.receipt_id, "r");
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Pending, 0, 0)
    );
    assert_eq!(v.next_visible_at_ms, Some(T0));
    assert_eq!(v.observation, Some(obs.clone()));
    assert!(v.lease.is_none() && v.last_failure.is_none() && v.dead_letter.is_none());
    // The claim carries the observation to the worker.
    let c = claim(&fresh, "r", "w", T0, 100).await;
    assert_eq!(c.observation, Some(obs));
    assert!(
        store(&fresh)
            .receipt(&rid("unknown"), ms(T0))
            .await
            .unwrap()
            .is_none()
    );
}

async fn ids_and_workers_at_their_bounds_round_trip(fresh: Fresh) {
    let long_id = "\u{e9}".repeat(256);
    let odd_id = "a/b %2F ../\u{1F600} 'quoted' \"x\"";
    let obs =
        json!({"nested": {"list": [1, 2.5, "three", null, true]}, "unicode": "\u{e9}\u{1F600}"});
    let batch = [
        receipt_with(&long_id, 0, Some(obs.clone()), Some(0)),
        receipt(odd_id),
    ];
    enqueue_new(&fresh, &batch, T0).await;
    let long_worker = "\u{e9}".repeat(64);
    let c = claim(&fresh, &long_id, &long_worker, T0, 86_400_000).await;
    assert_eq!(
        (c.receipt_id.as_str(), c.finalized_at.get()),
        (long_id.as_str(), 0)
    );
    assert_eq!(
        (c.lease_owner.as_str(), c.lease_until_ms.get()),
        (long_worker.as_str(), T0 + 86_400_000)
    );
    assert_eq!(c.observation, Some(obs));
    let transcript = "t".repeat(512);
    let route = record(
        &fresh,
        &c,
        &accepted(&transcript),
        RetryPolicy::default(),
        T0 + 1,
    )
    .await;
    assert!(route.is_ok());
    assert_eq!(
        view(&fresh, &long_id, T0).await.transcript_id,
        Some(transcript)
    );
    let c = claim(&fresh, odd_id, "w", T0, 10).await;
    assert_eq!(c.receipt_id, odd_id);
    assert_eq!(view(&fresh, odd_id, T0).await.receipt_id, odd_id);
}

/// Every list the store orders by id uses the byte order of the id (as Rust
/// compares strings), whatever the database's collation would say.
async fn ids_order_by_their_bytes(fresh: Fresh) {
    let ids = [
        "b", "B", "a", "A", "_x", "10", "9", "\u{e9}", "e", "Z", "a b", "ab",
    ];
    let mut sorted = ids.map(str::to_owned).to_vec();
    sorted.sort();
    enqueue_new(&fresh, &ids.map(receipt), T0).await;
    let status = store(&fresh).status(ms(T0), 100).await.unwrap();
    let sample: Vec<_> = status.samples[&ReceiptState::Pending]
        .receipts
        .iter()
        .map(|r| r.receipt_id.clone())
        .collect();
    assert_eq!(sample, sorted, "status sample order");
    let claims = store(&fresh)
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(100))
        .await
        .unwrap();
    let claimed: Vec<_> = claims
        .iter()
        .map(|c| c.receipt_id.as_str().to_owned())
        .collect();
    assert_eq!(claimed, sorted, "claim order");
    for c in &claims {
        let perm = permanent(settled::domain::SettlementFailureCode::Unsupported, "x");
        record(&fresh, c, &perm, RetryPolicy::default(), T0)
            .await
            .unwrap();
    }
    let letters = store(&fresh).dead_letters(100, None).await.unwrap();
    let listed: Vec<_> = letters.iter().map(|d| d.receipt_id.clone()).collect();
    assert_eq!(listed, sorted, "dead-letter order");
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store(&fresh).dead_letters(5, after.clone()).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.finalized_at, last.receipt_id.clone()));
        paged.extend(page.into_iter().map(|d| d.receipt_id));
    }
    assert_eq!(paged, sorted, "dead-letter pages");
}

crate::on_every_backend!(
    enqueue_is_created_then_existing_then_conflict,
    identity_ignores_key_order_and_treats_absent_as_null,
    visible_at_is_kept_exactly_and_is_not_identity,
    past_visible_at_is_due_at_once_and_orders_the_queue,
    finished_work_is_never_resurrected,
    batch_judges_each_receipt_including_duplicates,
    new_receipt_starts_pending_with_zero_counters,
    ids_and_workers_at_their_bounds_round_trip,
    ids_order_by_their_bytes,
);
