//! Requests queued on one replica while a write waits for a lock share one
//! statement and one transaction, and each still gets its own answer.

use super::*;

/// Poll `call` once, which queues its write, and hand it back unanswered.
async fn queued<F: std::future::Future>(call: F) -> std::pin::Pin<Box<F>> {
    let mut call = Box::pin(call);
    std::future::poll_fn(|cx| {
        assert!(
            call.as_mut().poll(cx).is_pending(),
            "answered while the writer was held"
        );
        std::task::Poll::Ready(())
    })
    .await;
    call
}

/// Wait until a backend of this database waits for a row lock.
async fn until_a_write_waits_for_a_lock(admin: &mut sqlx::PgConnection) {
    let started = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(started.elapsed() < WAKE_BOUND, "no write ever waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store whose pool of two runs one writer, so that everything queued
/// behind a held write forms a single group.
async fn single_writer_store(url: &str) -> SharedStore {
    let options = PostgresOptions {
        max_connections: 2,
        ..PostgresOptions::default()
    };
    Arc::new(PostgresStore::connect(url, &options).await.unwrap())
}

/// An admin connection, and one holding `lock` in an open transaction
/// (commit it with `COMMIT` to let the queued writes go).
async fn holding(url: &str, lock: &'static str) -> (sqlx::PgConnection, sqlx::PgConnection) {
    let admin = common::pg_raw(url).await.unwrap();
    let mut holder = common::pg_raw(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query(lock).execute(&mut holder).await.unwrap();
    (admin, holder)
}

/// Outcomes that queue while the replica's writer is busy share one
/// transaction, and each is answered as it would be alone: a stale claim in
/// the group is refused, the others (a fresh claim of the same receipt among
/// them) commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_outcomes_share_a_transaction_and_a_stale_one_is_refused_alone() {
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let store = single_writer_store(&url).await;
    let s = store.as_ref();
    let ids: Vec<String> = (0..6).map(|i| format!("r-{i}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    s.enqueue(&receipts, ms(T0)).await.unwrap();
    let claims = s
        .claim_due(&worker("w"), ms(T0), lease(60_000), limit(6))
        .await
        .unwrap();
    assert_eq!(claims.len(), 6);
    // r-5 is released and claimed again: its first claim is stale.
    let stale = claims[5].clone();
    s.release_lease(&stale, ms(T0 + 1)).await.unwrap();
    let fresh_claim = s
        .claim_due(&worker("w"), ms(T0 + 2), lease(60_000), limit(1))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fresh_claim.receipt_id, "r-5");

    let accepted = Outcome::Accepted {
        transcript_id: TranscriptId::parse("tx").unwrap(),
    };
    let policy = RetryPolicy::default();
    let at = T0 + 10;
    // Hold r-0's row so that the writer blocks on the first outcome.
    let (mut admin, mut holder) = holding(
        &url,
        "SELECT 1 FROM receipts WHERE receipt_id = 'r-0' FOR UPDATE",
    )
    .await;
    let held = queued(s.record_claimed_outcome(&claims[0], &accepted, policy, ms(at))).await;
    until_a_write_waits_for_a_lock(&mut admin).await;
    let mut group = Vec::new();
    for claim in &claims[1..5] {
        group.push(queued(s.record_claimed_outcome(claim, &accepted, policy, ms(at))).await);
    }
    group.push(queued(s.record_claimed_outcome(&stale, &accepted, policy, ms(at))).await);
    group.push(queued(s.record_claimed_outcome(&fresh_claim, &accepted, policy, ms(at))).await);
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    assert_eq!(held.await, Ok(Route::NoAction));
    let mut answers = Vec::new();
    for call in group {
        answers.push(call.await);
    }
    for answer in &answers[..4] {
        assert_eq!(answer, &Ok(Route::NoAction));
    }
    let refused = answers[4].as_ref().unwrap_err();
    assert_eq!(refused.class(), StoreErrorClass::Conflict);
    assert!(refused.to_string().contains("lease token"), "{refused}");
    assert_eq!(answers[5], Ok(Route::NoAction));
    for id in &ids {
        let view = s
            .receipt(&ReceiptId::parse(id).unwrap(), ms(at))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.state, ReceiptState::Settled, "{id}");
    }
    // The five queued commits were written by one transaction.
    let writers: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT xmin::text FROM receipt_history \
         WHERE outcome = 'accepted' AND receipt_id <> 'r-0'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(writers.len(), 1, "transactions: {writers:?}");
}

/// Batch claims that queue while the replica's claim task is busy share one
/// statement and transaction, served in arrival order: each worker gets the
/// next due receipts up to its limit, as if it had claimed alone just after
/// the previous one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_claims_share_a_statement_in_arrival_order() {
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let store = single_writer_store(&url).await;
    let s = store.as_ref();
    let receipts: Vec<_> = (0..10).map(|i| receipt(&format!("r-{i}"))).collect();
    s.enqueue(&receipts, ms(T0)).await.unwrap();

    // Hold the table so that the first claim waits and the others queue.
    let (mut admin, mut holder) = holding(&url, "LOCK TABLE receipts IN EXCLUSIVE MODE").await;
    let (a, b, c) = (worker("a"), worker("b"), worker("c"));
    let first = queued(s.claim_due(&a, ms(T0), lease(60_000), limit(2))).await;
    until_a_write_waits_for_a_lock(&mut admin).await;
    let second = queued(s.claim_due(&b, ms(T0), lease(60_000), limit(3))).await;
    let third = queued(s.claim_due(&c, ms(T0), lease(60_000), limit(10))).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    let ids = |claims: Vec<settled::domain::Claimed>, who: &str| {
        claims
            .into_iter()
            .map(|claim| {
                assert_eq!(claim.lease_owner, who);
                claim.claim.receipt_id
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(first.await.unwrap(), "a"), ["r-0", "r-1"]);
    assert_eq!(ids(second.await.unwrap(), "b"), ["r-2", "r-3", "r-4"]);
    assert_eq!(
        ids(third.await.unwrap(), "c"),
        ["r-5", "r-6", "r-7", "r-8", "r-9"]
    );
    let writers: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT xmin::text FROM receipts WHERE lease_owner IN ('b', 'c')",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(writers.len(), 1, "transactions: {writers:?}");
}
