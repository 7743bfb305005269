//! Background writes (the rates of `GET /v1/stats`) must not make requests
//! wait longer while the database is failing: alone, they are refused at
//! once after a failed group, instead of holding the writer for another
//! busy timeout.

use std::time::{Duration, Instant};

use super::SqliteStore;
use super::test_support::receipt;
use crate::domain::UnixMs;
use crate::store::SettlementOutcomeStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_writes_alone_wait_while_the_database_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("background.db");
    let store = SqliteStore::open(&format!("sqlite:{}", path.display()))
        .await
        .expect("open");
    store.writer.background(|_| Ok(())).await.expect("runs");

    // Another process holds the write lock: a request fails after the busy timeout.
    let holder = rusqlite::Connection::open(&path).expect("second connection");
    holder.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    assert!(store.enqueue(&[receipt("a")], ms(1)).await.is_err());
    let started = Instant::now();
    let refused = store.writer.background(|_| Ok(())).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not after the busy timeout: {:?}",
        started.elapsed()
    );

    // The lock goes: requests commit, and background writes run again.
    holder.execute_batch("ROLLBACK").expect("unlock");
    store
        .enqueue(&[receipt("b")], ms(1))
        .await
        .expect("commits");
    store
        .writer
        .background(|_| Ok(()))
        .await
        .expect("runs again");
}

/// A test time as the store takes it.
fn ms(value: u64) -> UnixMs {
    UnixMs::saturating(value)
}
