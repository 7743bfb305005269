//! Operators' actions (docs/operators.md, "Act on many receipts"): hold,
//! unhold, cancel and redrive, each judged on its own row, with history.

use settled::domain::{RetryPolicy, SettlementFailureCode, StoreErrorClass};
use settled::store::{Acted, ActionRefusal, OperatorAction, ReceiptClaim, ReceiptState};

use super::support::*;
use crate::common::Fresh;

fn hold() -> OperatorAction {
    OperatorAction::Hold {
        reason: Some("dispute".into()),
    }
}

fn cancel() -> OperatorAction {
    OperatorAction::Cancel {
        reason: "duplicate".into(),
    }
}

async fn act(
    fresh: &Fresh,
    action: &OperatorAction,
    ids: &[&str],
    now: u64,
    dry_run: bool,
) -> Vec<Result<Acted, ActionRefusal>> {
    let ids: Vec<_> = ids.iter().map(|id| rid(id)).collect();
    store(fresh)
        .act(action, &ids, Some("alice"), ms(now), dry_run)
        .await
        .expect("act")
}

async fn a_held_receipt_is_not_claimed_until_unheld(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("a"), receipt("b")], T0).await;
    assert_eq!(
        act(&fresh, &hold(), &["a"], T0, false).await,
        [Ok(Acted::Done)]
    );
    // Holding again changes nothing and writes no second entry.
    assert_eq!(
        act(&fresh, &hold(), &["a"], T0, false).await,
        [Ok(Acted::Unchanged)]
    );
    let v = view(&fresh, "a", T0 + 1).await;
    assert_eq!((v.state, v.held_at_ms), (ReceiptState::Pending, Some(T0)));
    let entry = v.history.last().expect("hold entry");
    assert_eq!(
        (
            entry.outcome.as_str(),
            entry.actor.as_deref(),
            entry.note.as_deref()
        ),
        ("hold", Some("alice"), Some("dispute"))
    );
    assert_eq!(v.history.len(), 1);

    // A batch claim passes it by; a claim by id is told why.
    let claimed = store(&fresh)
        .claim_due(&worker("w"), ms(T0 + 1), lease(1_000), limit(10))
        .await
        .unwrap();
    let ids: Vec<_> = claimed.iter().map(|c| c.receipt_id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    let by_id = store(&fresh)
        .claim_receipt(&rid("a"), &worker("w"), ms(T0 + 1), lease(1_000))
        .await
        .unwrap();
    assert_eq!(by_id, ReceiptClaim::Held);
    // Still counted where it was; not the oldest due.
    let status = store(&fresh).status(ms(T0 + 5), 10).await.unwrap();
    assert_eq!((status.counts.pending, status.counts.leased), (1, 1));
    assert_eq!(status.oldest_due_age_ms, 0);

    assert_eq!(
        act(&fresh, &OperatorAction::Unhold, &["a"], T0 + 2, false).await,
        [Ok(Acted::Done)]
    );
    assert_eq!(view(&fresh, "a", T0 + 2).await.held_at_ms, None);
    claim(&fresh, "a", "w", T0 + 3, 1_000).await;
}

async fn a_live_lease_on_a_held_receipt_may_still_finish(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    assert_eq!(
        act(&fresh, &hold(), &["r"], T0 + 1, false).await,
        [Ok(Acted::Done)]
    );
    // A retry waits, held; the next claim comes only after an unhold.
    record(&fresh, &c, &rpc("x"), RetryPolicy::default(), T0 + 2)
        .await
        .expect("the lease holder may report");
    let v = view(&fresh, "r", T0 + 100_000).await;
    assert_eq!(
        (v.state, v.held_at_ms),
        (ReceiptState::RetryScheduled, Some(T0 + 1))
    );
    let none = store(&fresh)
        .claim_due(&worker("w"), ms(T0 + 100_000), lease(1_000), limit(10))
        .await
        .unwrap();
    assert!(none.is_empty());
    act(&fresh, &OperatorAction::Unhold, &["r"], T0 + 100_001, false).await;
    let c = claim(&fresh, "r", "w", T0 + 100_002, 1_000).await;
    record(
        &fresh,
        &c,
        &accepted("tx"),
        RetryPolicy::default(),
        T0 + 100_003,
    )
    .await
    .unwrap();
    assert_eq!(
        state(&fresh, "r", T0 + 100_004).await,
        ReceiptState::Settled
    );
}

async fn cancel_finishes_for_good_and_refuses_what_it_must(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[receipt("pending"), receipt("leased"), receipt("settled")],
        T0,
    )
    .await;
    let c = claim(&fresh, "leased", "w", T0, 1_000).await;
    let s = claim(&fresh, "settled", "w", T0, 1_000).await;
    record(&fresh, &s, &accepted("tx"), RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();
    let results = act(
        &fresh,
        &cancel(),
        &["pending", "leased", "settled", "missing"],
        T0 + 2,
        false,
    )
    .await;
    assert_eq!(
        results,
        [
            Ok(Acted::Done),
            Err(ActionRefusal::Leased),
            Err(ActionRefusal::Finished),
            Err(ActionRefusal::NotFound),
        ]
    );
    let v = view(&fresh, "pending", T0 + 3).await;
    assert_eq!(
        (v.state, v.cancel_reason.as_deref(), v.next_visible_at_ms),
        (ReceiptState::Canceled, Some("duplicate"), None)
    );
    assert_eq!(v.history.last().unwrap().outcome, "cancel");
    // Its worker's lease is untouched; once expired, cancel goes through.
    assert_eq!(
        view(&fresh, "leased", T0 + 3).await.state,
        ReceiptState::Leased
    );
    assert_eq!(
        act(&fresh, &cancel(), &["leased"], T0 + 1_000, false).await,
        [Ok(Acted::Done)]
    );
    let late = record(
        &fresh,
        &c,
        &accepted("tx2"),
        RetryPolicy::default(),
        T0 + 1_001,
    )
    .await;
    assert_eq!(late.unwrap_err().class(), StoreErrorClass::Conflict);
    // Enqueue stays idempotent; nothing claims it again; it is counted.
    let again = store(&fresh)
        .enqueue(&[receipt("pending")], ms(T0 + 5))
        .await
        .unwrap();
    assert_eq!(again, [settled::store::Enqueued::Existing]);
    let status = store(&fresh).status(ms(T0 + 2_000), 10).await.unwrap();
    assert_eq!((status.counts.canceled, status.counts.pending), (2, 0));
    assert_eq!(status.samples[&ReceiptState::Canceled].receipts.len(), 2);
}

async fn dead_letters_can_be_redriven_or_canceled_in_bulk_and_dry_runs_change_nothing(
    fresh: Fresh,
) {
    let ids = ["d1", "d2", "d3"];
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    for id in ids {
        let c = claim(&fresh, id, "w", T0, 1_000).await;
        let dead = permanent(SettlementFailureCode::Rpc, "no");
        record(&fresh, &c, &dead, RetryPolicy::default(), T0 + 1)
            .await
            .unwrap();
    }
    let dry = act(
        &fresh,
        &OperatorAction::Redrive,
        &["d1", "d2", "nope"],
        T0 + 2,
        true,
    )
    .await;
    assert_eq!(
        dry,
        [
            Ok(Acted::Done),
            Ok(Acted::Done),
            Err(ActionRefusal::NotFound)
        ]
    );
    assert_eq!(
        state(&fresh, "d1", T0 + 2).await,
        ReceiptState::DeadLettered
    );
    assert_eq!(view(&fresh, "d1", T0 + 2).await.history.len(), 1);

    let done = act(
        &fresh,
        &OperatorAction::Redrive,
        &["d1", "d2"],
        T0 + 3,
        false,
    )
    .await;
    assert_eq!(done, [Ok(Acted::Done), Ok(Acted::Done)]);
    let v = view(&fresh, "d1", T0 + 3).await;
    assert_eq!((v.state, v.attempts), (ReceiptState::Pending, 0));
    let entry = v.history.last().unwrap();
    assert_eq!(
        (entry.outcome.as_str(), entry.actor.as_deref()),
        ("redrive", Some("alice"))
    );
    // Redriving again is refused: never done twice.
    let again = act(&fresh, &OperatorAction::Redrive, &["d1"], T0 + 4, false).await;
    assert_eq!(again, [Err(ActionRefusal::NotDeadLettered)]);

    assert_eq!(
        act(&fresh, &cancel(), &["d3"], T0 + 5, false).await,
        [Ok(Acted::Done)]
    );
    let v = view(&fresh, "d3", T0 + 5).await;
    assert_eq!(
        (v.state, v.dead_letter.is_none()),
        (ReceiptState::Canceled, true)
    );
    // Hold is for active work only.
    assert_eq!(
        act(&fresh, &hold(), &["d3"], T0 + 6, false).await,
        [Err(ActionRefusal::NotActive)]
    );
    let status = store(&fresh).status(ms(T0 + 6), 10).await.unwrap();
    assert_eq!(
        (
            status.counts.dead_lettered,
            status.counts.canceled,
            status.counts.pending
        ),
        (0, 1, 2)
    );
}

crate::on_every_backend!(
    a_held_receipt_is_not_claimed_until_unheld,
    a_live_lease_on_a_held_receipt_may_still_finish,
    cancel_finishes_for_good_and_refuses_what_it_must,
    dead_letters_can_be_redriven_or_canceled_in_bulk_and_dry_runs_change_nothing,
);
