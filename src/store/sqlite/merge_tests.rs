//! The writer merges requests that queue together; each must still get the
//! answer it would get alone.

use std::time::Duration;

use super::SqliteStore;
use super::test_support::{open, receipt};
use crate::domain::{
    ClaimLimit, LeaseMs, Outcome, ReceiptId, RetryPolicy, Route, StoreError, TranscriptId, UnixMs,
    WorkerId,
};
use crate::store::{NewReceipt, ReceiptState, SettlementOutcomeStore};

const NOW: u64 = 1_000_000;

/// Hold the writer thread busy so that the next requests queue behind it; it
/// goes on once `release` sees `n` requests queued, so that they all land in
/// the next group however slow the machine is.
struct Held {
    task: tokio::task::JoinHandle<()>,
    go: std::sync::mpsc::Sender<()>,
}

async fn hold_writer(store: &SqliteStore) -> Held {
    let writer = store.writer.clone();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (running, started) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        writer
            .solo(move |_| {
                let _ = running.send(());
                let _ = wait.recv_timeout(Duration::from_secs(30));
                Ok(())
            })
            .await
            .expect("hold");
    });
    started.await.expect("the writer took the holder");
    Held { task, go }
}

impl Held {
    async fn release(self, store: &SqliteStore, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.writer.queued() < n && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            store.writer.queued(),
            n,
            "requests queued behind the held writer"
        );
        self.go.send(()).expect("release");
        self.task.await.expect("holder");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_in_a_merged_group_leaves_the_others_committed() {
    let (_dir, store) = open().await;
    let store: std::sync::Arc<SqliteStore> = std::sync::Arc::new(store);
    let receipts: Vec<NewReceipt> = (0..8).map(|i| receipt(&format!("r-{i}"))).collect();
    store.enqueue(&receipts, ms(NOW)).await.expect("enqueue");
    let worker = WorkerId::parse("w").unwrap();
    let claims = store
        .claim_from(
            &worker,
            ms(NOW),
            LeaseMs::try_from(30_000).unwrap(),
            ClaimLimit::try_from(8).unwrap(),
            &[],
        )
        .await
        .expect("claim")
        .claims;
    assert_eq!(claims.len(), 8);

    let holder = hold_writer(&store).await;
    let before = store.writer.merged_requests();
    let mut tasks = Vec::new();
    for (i, claimed) in claims.into_iter().enumerate() {
        let mut claim = claimed.claim;
        if i == 3 {
            // A forged token: this one request must be refused.
            claim.lease_token = crate::domain::LeaseToken::parse(&"0".repeat(32)).unwrap();
        }
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let input = Outcome::Accepted {
                transcript_id: TranscriptId::parse(&format!("tx-{i}")).unwrap(),
            };
            let items = [(claim, input)];
            store
                .record_claimed_outcomes(&items, RetryPolicy::default(), ms(NOW + 10))
                .await
        }));
    }
    holder.release(&store, 8).await;
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().expect("call").pop().unwrap());
    }
    assert_eq!(
        store.writer.merged_requests() - before,
        8,
        "the eight requests queued behind the held writer were merged"
    );
    for (i, answer) in answers.iter().enumerate() {
        if i == 3 {
            assert!(
                matches!(answer, Err(StoreError::Conflict { .. })),
                "{answer:?}"
            );
        } else {
            assert_eq!(answer, &Ok(Route::NoAction));
        }
    }
    for i in 0..8 {
        let view = store
            .receipt(&ReceiptId::parse(&format!("r-{i}")).unwrap(), ms(NOW + 20))
            .await
            .unwrap()
            .unwrap();
        let expected = if i == 3 {
            ReceiptState::Leased
        } else {
            ReceiptState::Settled
        };
        assert_eq!(view.state, expected, "r-{i}");
        assert_eq!(view.history.len(), usize::from(i != 3), "r-{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_batch_refused_by_the_database_is_rerun_request_by_request() {
    let (_dir, store) = open().await;
    let store = std::sync::Arc::new(store);
    let holder = hold_writer(&store).await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let receipt = NewReceipt {
                // Past SQLite's signed range for one request only: the merged
                // insert fails, and only this request may fail with it.
                finalized_at: if i == 2 { u64::MAX } else { 1 },
                ..receipt(&format!("e-{i}"))
            };
            store.enqueue(std::slice::from_ref(&receipt), ms(NOW)).await
        }));
    }
    holder.release(&store, 4).await;
    for (i, t) in tasks.into_iter().enumerate() {
        let answer = t.await.unwrap();
        assert_eq!(answer.is_err(), i == 2, "e-{i}: {answer:?}");
    }
    let status = store.status(ms(NOW), 10).await.unwrap();
    assert_eq!(status.counts.pending, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_write_is_answered_and_the_writer_goes_on() {
    let (_dir, store) = open().await;
    let panicked = store
        .writer
        .solo(|conn| -> crate::store::StoreResult<()> {
            conn.execute("DELETE FROM receipts", [])?;
            panic!("a bug in a write");
        })
        .await;
    assert!(
        matches!(panicked, Err(StoreError::Backend { .. })),
        "{panicked:?}"
    );
    let receipt = receipt("after-the-panic");
    let created = store
        .enqueue(&[receipt], ms(NOW))
        .await
        .expect("later writes work");
    assert_eq!(created, vec![crate::store::Enqueued::Created]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_transaction_sqlite_dropped_keeps_and_acknowledges_nothing() {
    let (_dir, store) = open().await;
    let store = std::sync::Arc::new(store);
    let holder = hold_writer(&store).await;
    // Stands for SQLite rolling the whole transaction back on its own (a full
    // disk, an I/O error) while a write of the group was running.
    let writer = store.writer.clone();
    let dropped = tokio::spawn(async move {
        writer
            .solo(|conn| {
                conn.execute_batch("ROLLBACK")?;
                Ok(())
            })
            .await
    });
    let queued = store.clone();
    let enqueue = tokio::spawn(async move {
        let receipt = receipt("in-the-dropped-group");
        queued
            .enqueue(std::slice::from_ref(&receipt), ms(NOW))
            .await
    });
    holder.release(&store, 2).await;
    assert!(
        dropped.await.unwrap().is_err(),
        "the group was not committed"
    );
    let answer = enqueue.await.unwrap();
    assert!(answer.is_err(), "not acknowledged: {answer:?}");
    let id = ReceiptId::parse("in-the-dropped-group").unwrap();
    assert_eq!(
        store.receipt(&id, ms(NOW)).await.unwrap(),
        None,
        "and not kept"
    );
    let again = receipt(id.as_str());
    assert_eq!(
        store
            .enqueue(&[again], ms(NOW))
            .await
            .expect("the writer goes on"),
        vec![crate::store::Enqueued::Created]
    );
}

/// A group commit that fails must leave nothing of itself behind, the
/// writer's copy of the group table included: two claims in one group
/// commit, the first spending the bucket's one token and the second
/// reading the group after it; the commit is vetoed; a claim afterwards
/// still finds the committed token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_leaves_no_group_limits_behind() {
    use crate::domain::{GroupLimits, GroupName, Rate};
    use std::sync::atomic::{AtomicU32, Ordering};

    let (_dir, store) = open().await;
    let store = std::sync::Arc::new(store);
    let group = GroupName::parse("limited").unwrap();
    // One token, refilled so slowly that the test never sees it refill.
    let limits = GroupLimits {
        paused: false,
        max_leased: None,
        rate: Some(Rate {
            per_second: 0.000_001,
            burst: 1,
        }),
    };
    store
        .set_group(&group, &limits, ms(NOW))
        .await
        .expect("limits");
    let receipts: Vec<NewReceipt> = (0..2)
        .map(|i| NewReceipt {
            group: group.clone(),
            ..receipt(&format!("g-{i}"))
        })
        .collect();
    store.enqueue(&receipts, ms(NOW)).await.expect("enqueue");

    // The holder's own group commits (the hook's first call); the next one,
    // the two claims', is vetoed.
    let commits = std::sync::Arc::new(AtomicU32::new(0));
    let counted = commits.clone();
    let writer = store.writer.clone();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (running, started) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        writer
            .solo(move |conn| {
                conn.commit_hook(Some(move || counted.fetch_add(1, Ordering::SeqCst) == 1))
                    .expect("a commit hook");
                let _ = running.send(());
                let _ = wait.recv_timeout(Duration::from_secs(30));
                Ok(())
            })
            .await
            .expect("hold");
    });
    started.await.expect("the writer took the holder");
    let claim = |store: std::sync::Arc<SqliteStore>| async move {
        store
            .claim_from(
                &WorkerId::parse("w").unwrap(),
                ms(NOW),
                LeaseMs::try_from(30_000).unwrap(),
                ClaimLimit::try_from(1).unwrap(),
                &[],
            )
            .await
    };
    let first = tokio::spawn(claim(store.clone()));
    let second = tokio::spawn(claim(store.clone()));
    Held { task: holder, go }.release(&store, 2).await;
    for vetoed in [first, second] {
        assert!(
            vetoed.await.unwrap().is_err(),
            "the vetoed group answers errors"
        );
    }
    assert_eq!(
        commits.load(Ordering::SeqCst),
        2,
        "the claims' group tried to commit"
    );

    let after = claim(store.clone())
        .await
        .expect("claim after the failed commit");
    assert_eq!(
        after.claims.len(),
        1,
        "the committed bucket still holds its token: {after:?}"
    );
}

/// A test time as the store takes it.
fn ms(value: u64) -> UnixMs {
    UnixMs::saturating(value)
}
