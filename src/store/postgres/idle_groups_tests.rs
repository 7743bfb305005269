//! A sweep never forgets a group that an enqueue in flight is naming: it
//! waits for the enqueue's transaction (which registered the group without
//! locking its row) and sees its receipt, or gives up for this pass.

use std::time::{Duration, Instant};

use super::super::PostgresStore;
use super::super::test_support::{fresh_store, raw, receipt};
use crate::domain::{GroupName, ReceiptId, UnixMs};
use crate::store::{GroupQuery, OperatorAction, SettlementOutcomeStore};

const NOW: u64 = 1_000_000;

/// The group `m`, left idle: its one receipt canceled.
async fn idle_group(store: &PostgresStore) {
    let mut r = receipt("r-1");
    r.group = GroupName::parse("m").expect("group");
    let now = UnixMs::saturating(NOW);
    store.enqueue(&[r], now).await.expect("enqueue");
    let cancel = OperatorAction::Cancel {
        reason: "test".into(),
    };
    let id = ReceiptId::parse("r-1").expect("id");
    store
        .act(&cancel, &[id], None, now, false)
        .await
        .expect("cancel");
}

/// Group `m`'s depth, if it is listed.
async fn depth_of_m(store: &PostgresStore) -> Option<u64> {
    let query = GroupQuery {
        limit: 1,
        after: "m".into(),
        exact: true,
        depth: true,
    };
    let listed = store
        .groups(UnixMs::saturating(NOW), &query)
        .await
        .expect("groups");
    listed.first().map(|g| g.depth.unwrap_or(0))
}

/// What an enqueue does, in a transaction left open: the group registered
/// as `ON CONFLICT DO NOTHING` (no lock on the existing row), then the receipt.
const ENQUEUE_IN_FLIGHT: &str = "BEGIN; \
    INSERT INTO receipt_groups (name) VALUES ('m') ON CONFLICT (name) DO NOTHING; \
    INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
      next_visible_at_ms, created_at_ms, receipt_group, priority) \
    VALUES ('r-2', 1, 'active', 0, 0, 0, 0, 'm', 0)";

/// A store whose group `m` is idle, and a connection enqueueing into `m`
/// in a transaction left open.
async fn enqueue_in_flight() -> Option<(PostgresStore, sqlx::PgConnection)> {
    let (url, store) = fresh_store().await?;
    idle_group(&store).await;
    let mut producer = raw(&url).await;
    sqlx::raw_sql(ENQUEUE_IN_FLIGHT)
        .execute(&mut producer)
        .await
        .expect("enqueue");
    Some((store, producer))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_waits_for_an_enqueue_naming_the_group() {
    let Some((store, mut producer)) = enqueue_in_flight().await else {
        return;
    };
    let store = std::sync::Arc::new(store);
    let sweeping = {
        let store = store.clone();
        tokio::spawn(async move { store.forget_idle_groups("", 100).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    sqlx::raw_sql("COMMIT")
        .execute(&mut producer)
        .await
        .expect("commit");
    // It waited and saw the receipt, or (on a slow machine) gave up its
    // wait for this pass; either way the group stays.
    match sweeping.await.expect("sweep task") {
        Ok(swept) => assert_eq!(swept.forgotten, 0, "{swept:?}"),
        Err(e) => assert!(e.to_string().contains("lock"), "{e}"),
    }
    assert_eq!(
        depth_of_m(&store).await,
        Some(1),
        "m is listed with its new receipt"
    );
    // Idle again, it is forgotten.
    let cancel = OperatorAction::Cancel {
        reason: "test".into(),
    };
    let id = ReceiptId::parse("r-2").expect("id");
    let now = UnixMs::saturating(NOW);
    store
        .act(&cancel, &[id], None, now, false)
        .await
        .expect("cancel");
    let swept = store.forget_idle_groups("", 100).await.expect("sweep");
    assert_eq!(swept.forgotten, 1);
    assert_eq!(depth_of_m(&store).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_gives_up_rather_than_hold_enqueues_up() {
    let Some((store, mut producer)) = enqueue_in_flight().await else {
        return;
    };
    let started = Instant::now();
    let swept = store.forget_idle_groups("", 100).await;
    let waited = started.elapsed();
    assert!(swept.is_err(), "{swept:?}");
    assert!(waited < Duration::from_secs(5), "gave up after {waited:?}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut producer)
        .await
        .expect("rollback");
    assert_eq!(depth_of_m(&store).await, Some(0), "m is still listed");
}
