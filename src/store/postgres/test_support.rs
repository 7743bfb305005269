//! A database of its own for each PostgreSQL unit test, on the server
//! `SETTLED_TEST_POSTGRES_URL` names; without it a test says it skipped and
//! passes, as the integration tests do.

use sqlx::Connection;

use super::{PostgresOptions, PostgresStore};
use crate::domain::{GroupName, Priority, ReceiptId};
use crate::store::NewReceipt;

const POSTGRES_ENV: &str = "SETTLED_TEST_POSTGRES_URL";

/// The URL of a new, empty database, or `None` (saying so) when no server
/// is set. Named as the integration tests name theirs
/// (`settled_test_<secs>_<hex>`), so that their sweep drops it later.
pub async fn fresh_url() -> Option<String> {
    let Ok(base) = std::env::var(POSTGRES_ENV) else {
        eprintln!("SKIPPED: {POSTGRES_ENV} is not set, so this PostgreSQL test did not run");
        return None;
    };
    let name = settled_test_support::postgres::test_database_name();
    let url = settled_test_support::postgres::create_database(&base, &name)
        .await
        .expect("create test database");
    Some(url)
}

/// A store on a new database, with the default options.
pub async fn fresh_store() -> Option<(String, PostgresStore)> {
    fresh_store_with(&PostgresOptions::default()).await
}

/// A store on a new database, with `options`.
pub async fn fresh_store_with(options: &PostgresOptions) -> Option<(String, PostgresStore)> {
    let url = fresh_url().await?;
    let store = PostgresStore::connect(&url, options)
        .await
        .expect("open postgres");
    Some((url, store))
}

/// A plain connection to a test database, working in settled's schema.
pub async fn raw(url: &str) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("connect to the test database");
    sqlx::query("SET search_path = settled")
        .execute(&mut conn)
        .await
        .expect("search path");
    conn
}

/// A receipt of the default group, due at once, with an observation: the
/// rows are as wide as the integration tests' (a never-analyzed table's
/// row estimate, and so its plans, follow from its pages).
pub fn receipt(id: &str) -> NewReceipt {
    NewReceipt {
        priority: Priority::default(),
        trace: None,
        receipt_id: ReceiptId::parse(id).expect("id"),
        finalized_at: 1_700_000_000,
        observation: Some(serde_json::json!({"amount": 5})),
        visible_at_ms: None,
        group: GroupName::default_group(),
    }
}
