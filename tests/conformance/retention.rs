//! Retention removes exactly the finished receipts past the period, with
//! their history, and nothing active or dead-lettered. Runs on every backend.

use crate::on_every_backend;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Fresh, ms, raw_exec};
use settled::clock::ManualClock;
use settled::domain::*;
use settled::store::{NewReceipt, ReceiptState};

const T: u64 = 1_000_000;

fn receipt(id: &str) -> NewReceipt {
    NewReceipt {
        priority: settled::domain::Priority::default(),
        trace: None,
        receipt_id: ReceiptId::parse(id).unwrap(),
        finalized_at: 1,
        observation: None,
        visible_at_ms: None,
        group: settled::domain::GroupName::default_group(),
    }
}

async fn finish(fresh: &Fresh, id: &str, outcome: Outcome, at: u64) {
    let store = fresh.store.as_ref();
    store.enqueue(&[receipt(id)], ms(at)).await.unwrap();
    let worker = WorkerId::parse("w").unwrap();
    let claim = match store
        .claim_receipt(
            &ReceiptId::parse(id).unwrap(),
            &worker,
            ms(at),
            LeaseMs::try_from(1000).unwrap(),
        )
        .await
        .unwrap()
    {
        settled::store::ReceiptClaim::Claimed(c) => c,
        other => panic!("{other:?}"),
    };
    store
        .record_claimed_outcome(&claim, &outcome, RetryPolicy::default(), ms(at))
        .await
        .unwrap();
}

fn accepted() -> Outcome {
    Outcome::Accepted {
        transcript_id: TranscriptId::parse("t").unwrap(),
    }
}

async fn state(fresh: &Fresh, id: &str) -> Option<ReceiptState> {
    fresh
        .store
        .receipt(&ReceiptId::parse(id).unwrap(), ms(T * 10))
        .await
        .unwrap()
        .map(|v| v.state)
}

async fn retention_removes_only_old_finished_receipts(fresh: Fresh) {
    finish(&fresh, "old-settled", accepted(), T).await;
    finish(
        &fresh,
        "old-skipped",
        Outcome::Skipped {
            reason: SettlementSkipReason::Denied,
        },
        T,
    )
    .await;
    let perm = Outcome::Permanent {
        reason: SettlementFailureReason::new(SettlementFailureCode::Signature, ""),
    };
    finish(&fresh, "old-dead", perm, T).await;
    let rpc = Outcome::Retryable {
        reason: SettlementFailureReason::new(SettlementFailureCode::Rpc, ""),
        retry_after_ms: None,
    };
    finish(&fresh, "old-retry", rpc, T).await;
    fresh
        .store
        .enqueue(&[receipt("old-pending")], ms(T))
        .await
        .unwrap();
    fresh
        .store
        .enqueue(&[receipt("old-leased")], ms(T))
        .await
        .unwrap();
    let worker = WorkerId::parse("w").unwrap();
    fresh
        .store
        .claim_receipt(
            &ReceiptId::parse("old-leased").unwrap(),
            &worker,
            ms(T),
            LeaseMs::try_from(86_400_000).unwrap(),
        )
        .await
        .unwrap();
    finish(&fresh, "new-settled", accepted(), T + 5_000).await;

    // Everything that finished before T + 1000 is past a retention of 1 s at T + 2000.
    let clock = ManualClock::new(T + 2_000);
    let removed =
        settled::retention::purge_once(&fresh.store, &clock, Duration::from_secs(1)).await;
    assert_eq!(removed, 2);
    assert_eq!(state(&fresh, "old-settled").await, None);
    assert_eq!(state(&fresh, "old-skipped").await, None);
    assert_eq!(
        state(&fresh, "old-dead").await,
        Some(ReceiptState::DeadLettered)
    );
    assert_eq!(
        state(&fresh, "old-retry").await,
        Some(ReceiptState::RetryScheduled)
    );
    assert_eq!(
        state(&fresh, "old-pending").await,
        Some(ReceiptState::Pending)
    );
    assert_eq!(
        state(&fresh, "old-leased").await,
        Some(ReceiptState::Leased)
    );
    assert_eq!(
        state(&fresh, "new-settled").await,
        Some(ReceiptState::Settled)
    );
    // Their history went with them.
    let orphans = raw_exec(
        &fresh,
        "DELETE FROM receipt_history WHERE receipt_id IN ('old-settled', 'old-skipped')",
    )
    .await
    .unwrap();
    assert_eq!(orphans, 0);
    assert!(
        raw_exec(
            &fresh,
            "DELETE FROM receipt_history WHERE receipt_id = 'new-settled'"
        )
        .await
        .unwrap()
            > 0
    );
}

async fn retention_works_through_many_batches(fresh: Fresh) {
    let n = settled::retention::BATCH * 2 + 7;
    let receipts: Vec<_> = (0..n).map(|i| receipt(&format!("r{i:05}"))).collect();
    fresh.store.enqueue(&receipts, ms(T)).await.unwrap();
    let worker = WorkerId::parse("w").unwrap();
    let lease = LeaseMs::try_from(1000).unwrap();
    let mut items = Vec::new();
    while items.len() < n {
        let claims = fresh
            .store
            .claim_due(&worker, ms(T), lease, ClaimLimit::try_from(1024).unwrap())
            .await
            .unwrap();
        items.extend(claims.into_iter().map(|c| (c, accepted())));
    }
    for chunk in items.chunks(1024) {
        for r in fresh
            .store
            .record_claimed_outcomes(
                &crate::support::leases(chunk.to_vec()),
                RetryPolicy::default(),
                ms(T),
            )
            .await
            .unwrap()
        {
            r.unwrap();
        }
    }
    let store = Arc::clone(&fresh.store);
    let removed =
        settled::retention::purge_once(&store, &ManualClock::new(T + 10), Duration::from_millis(5))
            .await;
    // The receipt holding the newest history entry stays until a newer
    // entry exists (docs/operators.md, "Follow every outcome").
    assert_eq!(removed, n as u64 - 1);
    assert_eq!(
        fresh.store.status(ms(T), 1).await.unwrap().counts.settled,
        1
    );
}

on_every_backend!(
    retention_removes_only_old_finished_receipts,
    retention_works_through_many_batches
);
