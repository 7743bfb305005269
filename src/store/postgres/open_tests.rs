//! What the pool's connections carry, read on the pool itself: each session
//! gets its settings when it connects, so another connection cannot see them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::test_support::{fresh_store_with, fresh_url, raw};
use super::{PostgresOptions, PostgresStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_carry_the_statement_timeout() {
    let options = PostgresOptions {
        statement_timeout_ms: 1_234,
        ..PostgresOptions::default()
    };
    let Some((_, store)) = fresh_store_with(&options).await else {
        return;
    };
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(shown, "1234ms");
    let slow = sqlx::query("SELECT pg_sleep(5)")
        .execute(&store.pool)
        .await
        .unwrap_err();
    assert!(slow.to_string().contains("statement timeout"), "{slow}");
}

/// Start-up waits for the schema lock and runs the migrations without the
/// statement time limit: a migration slower than it (a large index build,
/// a replica migrating first) must not make every start fail. Here another
/// session holds the setup lock a second, more than twice the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_wait_past_the_statement_timeout() {
    let Some(url) = fresh_url().await else {
        return;
    };
    // The advisory lock start-up takes ("settled\0"), held by someone else.
    const SETUP_LOCK: i64 = 0x7365_7474_6c65_6400;
    let mut holder = raw(&url).await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SETUP_LOCK)
        .execute(&mut holder)
        .await
        .unwrap();
    let options = PostgresOptions {
        statement_timeout_ms: 400,
        ..PostgresOptions::default()
    };
    let opened = AtomicBool::new(false);
    let open = async {
        let store = PostgresStore::connect(&url, &options).await;
        opened.store(true, Ordering::SeqCst);
        store
    };
    let release = async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let waited = !opened.load(Ordering::SeqCst);
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(SETUP_LOCK)
            .execute(&mut holder)
            .await
            .unwrap();
        waited
    };
    let (store, waited) = tokio::join!(open, release);
    assert!(waited, "start-up did not wait for the lock");
    let store = store.expect("migrated after the lock was released");
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(
        shown, "400ms",
        "the service's own statements keep their limit"
    );
}
