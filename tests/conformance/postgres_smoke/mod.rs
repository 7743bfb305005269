//! What only PostgreSQL has: several replicas on one database (a shared
//! binding, wakeups through `NOTIFY`, claims that never overlap), and
//! failing fast when the server is unreachable. The pool's settings and the
//! plans of the hot statements are checked by the library's own tests,
//! beside the code. The rules themselves are proven on every backend by
//! `store_conformance`.

use crate::common;
use crate::common::ms;
use crate::support::{FIN, T0, lease, limit, receipt_with, worker};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use settled::domain::{
    Outcome, ReceiptId, RetryPolicy, Route, SettlementFailureCode, SettlementFailureReason,
    StoreErrorClass, TranscriptId,
};
use settled::store::postgres::{PostgresOptions, PostgresStore};
use settled::store::{NewReceipt, ReceiptState, SharedStore};
use tokio::sync::Notify;

mod coalescing;
mod upkeep;

/// Upper bound on waiting for a notification; the tests never sleep.
const WAKE_BOUND: Duration = Duration::from_secs(10);

/// A receipt due now, with an observation.
fn receipt(id: &str) -> NewReceipt {
    receipt_with(id, FIN, Some(serde_json::json!({"amount": 5})), None)
}

async fn replica(url: &str) -> SharedStore {
    PostgresStore::open(url, &PostgresOptions::default())
        .await
        .expect("open replica")
}

/// Wait until `notify` is signalled, starting to listen before `act` runs.
async fn woken_by(notify: Arc<Notify>, act: impl std::future::Future<Output = ()>) -> bool {
    let notified = notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    act.await;
    tokio::time::timeout(WAKE_BOUND, notified).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_retries_then_settles_and_stale_commits_conflict() {
    let Some(fresh) = common::fresh_postgres().await else {
        return;
    };
    let s = fresh.store.as_ref();
    let w = worker("w1");
    s.enqueue_one(&receipt("r-1"), ms(T0)).await.unwrap();
    let first = s
        .claim_due(&w, ms(T0), lease(1_000), limit(8))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let fail = Outcome::Retryable {
        reason: SettlementFailureReason::new(SettlementFailureCode::Rpc, "timeout"),
        retry_after_ms: None,
    };
    let route = s
        .record_claimed_outcome(&first[0], &fail, RetryPolicy::default(), ms(T0 + 10))
        .await
        .unwrap();
    assert_eq!(
        route,
        Route::RetryScheduled {
            attempt: 1,
            next_visible_at_ms: T0 + 260
        }
    );
    assert!(
        s.claim_due(&w, ms(T0 + 259), lease(1_000), limit(8))
            .await
            .unwrap()
            .is_empty()
    );
    let second = s
        .claim_due(&w, ms(T0 + 260), lease(1_000), limit(8))
        .await
        .unwrap();
    assert_eq!((second[0].attempts, second[0].row_version.get()), (1, 2));
    assert_ne!(second[0].lease_token, first[0].lease_token);

    let accepted = Outcome::Accepted {
        transcript_id: TranscriptId::parse("tx-9").unwrap(),
    };
    let stale = s
        .record_claimed_outcome(&first[0], &accepted, RetryPolicy::default(), ms(T0 + 300))
        .await
        .unwrap_err();
    assert_eq!(stale.class(), StoreErrorClass::Conflict);
    let route = s
        .record_claimed_outcome(&second[0], &accepted, RetryPolicy::default(), ms(T0 + 300))
        .await
        .unwrap();
    assert_eq!(route, Route::NoAction);

    let view = s
        .receipt(&ReceiptId::parse("r-1").unwrap(), ms(T0 + 400))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, ReceiptState::Settled);
    assert_eq!(view.transcript_id.as_deref(), Some("tx-9"));
    assert_eq!(view.observation, Some(serde_json::json!({"amount": 5})));
    let outcomes: Vec<_> = view.history.iter().map(|h| h.outcome.as_str()).collect();
    assert_eq!(outcomes, ["retryable", "accepted"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_one_database_share_its_binding_and_no_other_does() {
    let Some(fresh) = common::fresh_postgres().await else {
        return;
    };
    let other = replica(&fresh.url).await;
    assert_eq!(
        fresh.store.settlement_store_binding(),
        other.settlement_store_binding()
    );
    let elsewhere = common::fresh_postgres().await.unwrap();
    assert_ne!(
        fresh.store.settlement_store_binding(),
        elsewhere.store.settlement_store_binding()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_on_one_replica_wakes_long_polls_on_another() {
    let Some(fresh) = common::fresh_postgres().await else {
        return;
    };
    let (a, b) = (fresh.store.clone(), replica(&fresh.url).await);
    let s = b.clone();
    assert!(
        woken_by(a.work_notifier(), async move {
            s.enqueue_one(&receipt("r-1"), ms(T0)).await.unwrap();
        })
        .await
    );
    let claim = b
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(1))
        .await
        .unwrap()
        .remove(0);
    let s = b.clone();
    assert!(
        woken_by(a.work_notifier(), async move {
            s.release_lease(&claim, ms(T0 + 1)).await.unwrap();
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeups_survive_a_dropped_listener_connection() {
    let Some(fresh) = common::fresh_postgres().await else {
        return;
    };
    let (a, b) = (fresh.store.clone(), replica(&fresh.url).await);
    let mut admin = common::pg_raw(&fresh.url).await.unwrap();
    // Kill every listening connection on this database; both replicas resubscribe.
    let kill = async {
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap();
        assert!(killed.len() >= 2, "listeners found: {}", killed.len());
    };
    // Resubscribing wakes every waiter, since notifications may have been lost.
    assert!(woken_by(a.work_notifier(), kill).await);
    let s = b.clone();
    assert!(
        woken_by(a.work_notifier(), async move {
            s.enqueue_one(&receipt("r-2"), ms(T0)).await.unwrap();
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_never_claim_the_same_receipt() {
    let Some(fresh) = common::fresh_postgres().await else {
        return;
    };
    let receipts: Vec<_> = (0..200).map(|i| receipt(&format!("r-{i:03}"))).collect();
    fresh.store.enqueue(&receipts, ms(T0)).await.unwrap();
    let mut replicas = vec![fresh.store.clone()];
    for _ in 0..3 {
        replicas.push(replica(&fresh.url).await);
    }
    let mut tasks = Vec::new();
    for (n, store) in replicas.into_iter().enumerate() {
        for k in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let w = worker(&format!("w-{n}-{k}"));
                let mut mine = Vec::new();
                loop {
                    let got = store
                        .claim_due(&w, ms(T0), lease(60_000), limit(7))
                        .await
                        .unwrap();
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.claim.receipt_id));
                }
            }));
        }
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(seen.insert(id.clone()), "{id} claimed twice");
        }
    }
    assert_eq!(seen.len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_fast_with_a_backend_error() {
    // Port 1 on localhost refuses connections; the timeout bounds the rest.
    let options = PostgresOptions {
        connect_timeout_ms: 500,
        ..PostgresOptions::default()
    };
    let started = Instant::now();
    let error = PostgresStore::open("postgres://postgres@127.0.0.1:1/postgres", &options)
        .await
        .err()
        .expect("no server there");
    assert_eq!(error.class(), StoreErrorClass::Backend);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

/// A database error aborts a whole PostgreSQL transaction, unlike SQLite's:
/// the store must still judge each item of a batch on its own.
async fn a_refused_item_does_not_abort_its_batch(fresh: common::Fresh) {
    let s = fresh.store.as_ref();
    s.enqueue(&[receipt("r-1"), receipt("r-2")], ms(T0))
        .await
        .unwrap();
    let claims = s
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(2))
        .await
        .unwrap();
    // A digest that is not 64 hex characters: the CHECK constraint refuses it.
    let corrupt = Outcome::Permanent {
        reason: SettlementFailureReason {
            code: SettlementFailureCode::Rpc,
            detail_sha256: "not-a-digest".to_owned(),
            rail_code: None,
        },
    };
    let accepted = Outcome::Accepted {
        transcript_id: TranscriptId::parse("tx").unwrap(),
    };
    let batch = [(claims[0].clone(), corrupt), (claims[1].clone(), accepted)];
    let results = s
        .record_claimed_outcomes(
            &crate::support::leases(batch.to_vec()),
            RetryPolicy::default(),
            ms(T0 + 1),
        )
        .await
        .unwrap();
    assert_eq!(
        results[0].as_ref().unwrap_err().class(),
        StoreErrorClass::InvalidRecord
    );
    assert_eq!(results[1], Ok(Route::NoAction));
    let first = s
        .receipt(&ReceiptId::parse("r-1").unwrap(), ms(T0 + 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.state, first.history.len()),
        (ReceiptState::Leased, 0),
        "the refused item changed nothing"
    );
    let second = s
        .receipt(&ReceiptId::parse("r-2").unwrap(), ms(T0 + 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.state, ReceiptState::Settled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_item_does_not_abort_its_batch_on_postgres() {
    if let Some(fresh) = common::fresh_postgres().await {
        a_refused_item_does_not_abort_its_batch(fresh).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_item_does_not_abort_its_batch_on_sqlite() {
    a_refused_item_does_not_abort_its_batch(common::fresh_sqlite().await).await;
}

/// Every claim and every outcome leaves a dead row version whose index
/// entries claims and `/v1/status` step over until a VACUUM removes them.
/// With `--pg-vacuum-dead-rows` set, settled vacuums the table itself once
/// that many are dead, whether or not autovacuum runs (it is off on the
/// test server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churning_receipts_table_is_vacuumed_by_settled() {
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let options = PostgresOptions {
        vacuum_dead_rows: 100,
        ..PostgresOptions::default()
    };
    let store = PostgresStore::open(&url, &options).await.unwrap();
    let s = store.as_ref();
    let receipts: Vec<_> = (0..300).map(|i| receipt(&format!("r-{i}"))).collect();
    s.enqueue(&receipts, ms(T0)).await.unwrap();
    let accepted = crate::support::accepted("tx");
    loop {
        let claims = s
            .claim_due(&worker("w"), ms(T0), lease(60_000), limit(100))
            .await
            .unwrap();
        if claims.is_empty() {
            break;
        }
        let batch: Vec<_> = claims.into_iter().map(|c| (c, accepted.clone())).collect();
        for result in s
            .record_claimed_outcomes(
                &crate::support::leases(batch),
                RetryPolicy::default(),
                ms(T0 + 1),
            )
            .await
            .unwrap()
        {
            assert_eq!(result, Ok(Route::NoAction));
        }
    }
    // 600 dead row versions now (a claim's and an outcome's per receipt),
    // counted once the store's connections report them (within seconds).
    let mut conn = common::pg_raw(&url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (vacuums, dead) = loop {
        let (vacuums, dead): (i64, i64) = sqlx::query_as(
            "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables \
             WHERE schemaname = 'settled' AND relname = 'receipts'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if (vacuums > 0 && dead < 100) || Instant::now() > deadline {
            break (vacuums, dead);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(vacuums > 0, "never vacuumed ({dead} dead row versions)");
    assert!(
        dead < 100,
        "{dead} dead row versions left after {vacuums} vacuums"
    );
    let view = s
        .receipt(&ReceiptId::parse("r-299").unwrap(), ms(T0 + 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, ReceiptState::Settled);
}
