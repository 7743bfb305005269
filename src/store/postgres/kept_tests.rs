//! The write queues' kept connections (src/store/postgres/kept.rs): a crowd
//! of claims and outcomes is served once each and committed, every write
//! made through the pool after it is committed (no borrower runs inside a
//! kept transaction), and no connection stays idle in a transaction once
//! the crowd is gone.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::super::PostgresOptions;
use super::super::test_support::{fresh_store_with, raw, receipt};
use crate::domain::{
    Claim, ClaimLimit, LeaseMs, Outcome, RetryPolicy, TranscriptId, UnixMs, WorkerId,
};
use crate::store::{ClaimAsk, SettlementOutcomeStore};

const RECEIPTS: usize = 600;
const WORKERS: usize = 32;

/// Sessions of the test's database idle inside a transaction.
async fn idle_in_transaction(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
    )
    .fetch_one(conn)
    .await
    .expect("pg_stat_activity")
}

/// A store whose statement timeout (and so idle-in-transaction timeout) is
/// longer than a test: the server ends no transaction the store left open.
async fn patient_store() -> Option<(String, super::super::PostgresStore)> {
    let options = PostgresOptions {
        statement_timeout_ms: 60_000,
        ..PostgresOptions::default()
    };
    fresh_store_with(&options).await
}

fn accepted() -> Outcome {
    Outcome::Accepted {
        transcript_id: TranscriptId::parse("tx").expect("transcript"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_claims_leaves_no_transaction_open_behind_it() {
    let Some((url, store)) = patient_store().await else {
        return;
    };
    let store = Arc::new(store);
    let now = UnixMs::saturating(1_000_000);
    let lease = LeaseMs::try_from(60_000).expect("lease");
    let one = ClaimLimit::try_from(1).expect("limit");
    let receipts: Vec<_> = (0..RECEIPTS).map(|i| receipt(&format!("r{i}"))).collect();
    store.enqueue(&receipts, now).await.expect("enqueue");
    // Workers claiming one at a time until nothing is due, half of them
    // carrying the outcome of their last claim in the next and half
    // reporting it on its own: both queues always have requests waiting
    // behind the group they run.
    let mut crowd = Vec::new();
    for w in 0..WORKERS {
        let store = store.clone();
        crowd.push(tokio::spawn(async move {
            let worker = WorkerId::parse(&format!("w{w}")).expect("worker");
            let mut mine = Vec::new();
            let mut done: Vec<(Claim, Outcome)> = Vec::new();
            loop {
                let ask = ClaimAsk {
                    worker_id: &worker,
                    now_ms: now,
                    lease_ms: lease,
                    limit: one,
                    only: &[],
                };
                let reported = store
                    .record_and_claim(&done, RetryPolicy::default(), ask)
                    .await
                    .expect("claim");
                for result in reported.results {
                    assert!(result.is_ok(), "an outcome was refused: {result:?}");
                }
                let due = reported.claimed.expect("claimed");
                if due.claims.is_empty() {
                    return mine;
                }
                mine.extend(due.claims.iter().map(|c| c.receipt_id.to_string()));
                done = due
                    .claims
                    .into_iter()
                    .map(|c| (c.claim, accepted()))
                    .collect();
                if w % 2 == 1 {
                    let routes = store
                        .record_claimed_outcomes(&done, RetryPolicy::default(), now)
                        .await
                        .expect("outcomes");
                    assert!(routes.iter().all(Result::is_ok), "refused: {routes:?}");
                    done.clear();
                }
            }
        }));
    }
    let mut claimed = HashSet::new();
    for worker in crowd {
        for id in worker.await.expect("worker") {
            assert!(claimed.insert(id.clone()), "{id} was claimed twice");
        }
    }
    assert_eq!(claimed.len(), RECEIPTS, "every receipt claimed once");
    let mut other = raw(&url).await;
    let settled = "SELECT count(*) FROM receipts WHERE status = 'settled'";
    let count: i64 = sqlx::query_scalar(settled)
        .fetch_one(&mut other)
        .await
        .expect("count");
    assert_eq!(count, RECEIPTS as i64, "every outcome committed");
    // The transaction opened for a group that did not come is given up, and
    // no connection went back to the pool inside one.
    let mut open = idle_in_transaction(&mut other).await;
    for _ in 0..40 {
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = idle_in_transaction(&mut other).await;
    }
    assert_eq!(open, 0, "a connection stayed idle in a transaction");
    // A claim alone, then its outcome through the pool (one statement that
    // commits by itself): seen by another session at once, so no borrower
    // ran inside a transaction the claims kept.
    let worker = WorkerId::parse("after").expect("worker");
    for i in 0..20 {
        let id = format!("after{i}");
        store.enqueue(&[receipt(&id)], now).await.expect("enqueue");
        let due = store
            .claim_from(&worker, now, lease, one, &[])
            .await
            .expect("claim");
        let claim = due.claims[0].claim.clone();
        let routes = store
            .record_claimed_outcomes(&[(claim, accepted())], RetryPolicy::default(), now)
            .await
            .expect("outcome");
        assert!(routes[0].is_ok(), "{id}: {:?}", routes[0]);
        let status: String =
            sqlx::query_scalar("SELECT status FROM receipts WHERE receipt_id = $1")
                .bind(&id)
                .fetch_one(&mut other)
                .await
                .expect("read");
        assert_eq!(status, "settled", "{id}'s outcome was not committed");
    }
}

/// A claim that meets a kept transaction whose connection the server ended
/// (an operator terminated it) is made on another connection: that
/// transaction had committed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_meeting_an_ended_kept_transaction_is_made_on_another() {
    let Some((url, store)) = patient_store().await else {
        return;
    };
    let now = UnixMs::saturating(1_000_000);
    store.enqueue(&[receipt("r")], now).await.expect("enqueue");
    let kept = store.claims.shared().kept.clone();
    let mut held = kept.begin(&store.pool).await.expect("begin");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await
        .expect("pid");
    kept.keep(held);
    let mut other = raw(&url).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut other)
        .await
        .expect("terminate");
    assert!(ended, "the kept connection's server process ended");
    let worker = WorkerId::parse("w").expect("worker");
    let lease = LeaseMs::try_from(60_000).expect("lease");
    let one = ClaimLimit::try_from(1).expect("limit");
    let due = store
        .claim_from(&worker, now, lease, one, &[])
        .await
        .expect("claimed on another connection");
    assert_eq!(due.claims.len(), 1);
}
