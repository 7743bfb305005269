//! Test support: a fresh database per test on every backend.
//!
//! This module is compiled into each of the four test binaries that name it
//! with `#[path]` (conformance, http_api, model, system), and each uses a
//! different part of it; `dead_code` is judged per binary, so every helper
//! would be "unused" in some binary. Items no binary uses are deleted (check
//! by building the four with this `allow` removed: an item warned about in
//! all four is dead).
#![allow(
    dead_code,
    reason = "each test binary that includes this module uses a different part of it"
)]

pub mod http;
pub mod process;
pub mod rng;

use std::sync::Arc;

use settled::domain::UnixMs;
use settled::store::SharedStore;
use settled::store::postgres::{PostgresOptions, PostgresStore};
use settled::store::sqlite::SqliteStore;
use sqlx::Connection;

/// The environment variable naming a PostgreSQL server for tests.
pub const POSTGRES_ENV: &str = "SETTLED_TEST_POSTGRES_URL";

/// A fresh, migrated, empty store and what it takes to reach under it.
pub struct Fresh {
    pub store: SharedStore,
    /// The database URL the store was opened with.
    pub url: String,
    /// Keeps a SQLite database's directory alive for the test.
    _dir: Option<tempfile::TempDir>,
}

/// A fresh SQLite store in its own temporary directory.
pub async fn fresh_sqlite() -> Fresh {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite:{}", dir.path().join("settled.db").display());
    let store: SharedStore = Arc::new(SqliteStore::open(&url).await.expect("open sqlite"));
    Fresh {
        store,
        url,
        _dir: Some(dir),
    }
}

/// A fresh PostgreSQL store on a database of its own, or `None` (with a
/// message saying so) when `SETTLED_TEST_POSTGRES_URL` is not set.
pub async fn fresh_postgres() -> Option<Fresh> {
    let url = fresh_postgres_url().await?;
    let store = PostgresStore::open(&url, &PostgresOptions::default())
        .await
        .expect("open postgres");
    Some(Fresh {
        store,
        url,
        _dir: None,
    })
}

/// A store on a database that a release with migrations up to `release`
/// created and that `load` (SQL, statements separated by `;`) filled, then
/// opened by this build, which applies the migrations after `release`:
/// what an upgrade finds. `None` when PostgreSQL is asked for and not set.
pub async fn upgraded(backend: &str, release: i64, load: &str) -> Option<Fresh> {
    let keep = |mut m: sqlx::migrate::Migrator| {
        m.migrations = m
            .migrations
            .iter()
            .filter(|m| m.version <= release)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        m
    };
    let statements = load.split(';').map(str::trim).filter(|s| !s.is_empty());
    if backend == "sqlite" {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite:{}", dir.path().join("settled.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .expect("connect");
        keep(sqlx::migrate!("migrations/sqlite"))
            .run(&mut conn)
            .await
            .expect("the release's migrations");
        for sql in statements {
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await
                .expect(sql);
        }
        conn.close().await.expect("close");
        let store: SharedStore = Arc::new(SqliteStore::open(&url).await.expect("upgrade"));
        return Some(Fresh {
            store,
            url,
            _dir: Some(dir),
        });
    }
    let url = fresh_postgres_url().await?;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("CREATE SCHEMA settled")
        .execute(&mut conn)
        .await
        .expect("schema");
    sqlx::query("SET search_path = settled")
        .execute(&mut conn)
        .await
        .expect("search path");
    keep(sqlx::migrate!("migrations/postgres"))
        .run(&mut conn)
        .await
        .expect("the release's migrations");
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .expect(sql);
    }
    conn.close().await.expect("close");
    let store = PostgresStore::open(&url, &PostgresOptions::default())
        .await
        .expect("upgrade");
    Some(Fresh {
        store,
        url,
        _dir: None,
    })
}

/// Create an empty database on the test server and return its URL.
pub async fn fresh_postgres_url() -> Option<String> {
    let Ok(base) = std::env::var(POSTGRES_ENV) else {
        eprintln!("SKIPPED: {POSTGRES_ENV} is not set, so this PostgreSQL test did not run");
        return None;
    };
    let name = settled_test_support::postgres::test_database_name();
    if !SWEPT.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let mut admin = sqlx::PgConnection::connect(&base)
            .await
            .expect("connect to test postgres");
        drop_stale_test_databases(&mut admin).await;
    }
    let url = settled_test_support::postgres::create_database(&base, &name)
        .await
        .expect("create test database");
    Some(url)
}

/// Whether this test process has dropped the stale test databases yet.
static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test databases older than this belong to no running test: a whole
/// `cargo test` takes minutes.
const STALE_AFTER_SECS: u64 = 3600;

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Drop the databases earlier test runs left (`settled_test_<secs>_<hex>`,
/// created more than an hour ago), so that `cargo test` run by hand does not
/// pile them up. A database still in use is left alone (no `FORCE`).
async fn drop_stale_test_databases(admin: &mut sqlx::PgConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE datname LIKE 'settled\\_test\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    let cutoff = unix_secs().saturating_sub(STALE_AFTER_SECS);
    for name in names {
        let created = name
            .strip_prefix("settled_test_")
            .and_then(|rest| rest.split_once('_'))
            .and_then(|(secs, hex)| {
                let hex_ok = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit());
                secs.parse::<u64>().ok().filter(|_| hex_ok)
            });
        if created.is_some_and(|secs| secs < cutoff) {
            // The name was matched to `settled_test_<digits>_<hex>` above.
            let sql = format!("DROP DATABASE IF EXISTS {name}");
            let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut *admin)
                .await;
        }
    }
}

/// A plain connection to a test database, working in settled's schema
/// (where the store keeps every table) as an operator's `psql` would.
pub async fn pg_raw(url: &str) -> Result<sqlx::PgConnection, sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query("SET search_path = settled")
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

/// The backend a test runs on, by name (`sqlite` or `postgres`).
pub async fn fresh(backend: &str) -> Option<Fresh> {
    match backend {
        "sqlite" => Some(fresh_sqlite().await),
        "postgres" => fresh_postgres().await,
        other => panic!("unknown backend {other}"),
    }
}

/// Run one SQL statement directly on the test's database, under the store.
pub async fn raw_exec(fresh: &Fresh, sql: &str) -> Result<u64, sqlx::Error> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if fresh.url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&fresh.url).await?;
        Ok(sqlx::query(sql).execute(&mut conn).await?.rows_affected())
    } else {
        let mut conn = pg_raw(&fresh.url).await?;
        Ok(sqlx::query(sql).execute(&mut conn).await?.rows_affected())
    }
}

/// Every row of a one-column query, decoded as `T`, straight from the
/// test's database (under the store).
pub async fn raw_scalars<T>(fresh: &Fresh, sql: &str) -> Vec<T>
where
    T: Send + Unpin,
    (T,): for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if fresh.url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&fresh.url)
            .await
            .expect("connect");
        sqlx::query_scalar(sql)
            .fetch_all(&mut conn)
            .await
            .expect("raw query")
    } else {
        let mut conn = pg_raw(&fresh.url).await.expect("connect");
        sqlx::query_scalar(sql)
            .fetch_all(&mut conn)
            .await
            .expect("raw query")
    }
}

/// Turn off CHECK constraints on the test's database so that a test can
/// plant a corrupt row the way a bad migration or a manual edit would.
pub async fn raw_exec_unchecked(fresh: &Fresh, sql: &str) -> Result<u64, sqlx::Error> {
    if fresh.url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&fresh.url).await?;
        sqlx::query("PRAGMA ignore_check_constraints = ON")
            .execute(&mut conn)
            .await?;
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        Ok(sqlx::query(sql).execute(&mut conn).await?.rows_affected())
    } else {
        let mut conn = pg_raw(&fresh.url).await?;
        let names: Vec<(String,)> = sqlx::query_as(
            "SELECT conname::text FROM pg_constraint WHERE conrelid = 'receipts'::regclass AND contype = 'c'",
        )
        .fetch_all(&mut conn)
        .await?;
        for (name,) in names {
            let drop =
                sqlx::AssertSqlSafe(format!("ALTER TABLE receipts DROP CONSTRAINT \"{name}\""));
            sqlx::query(drop).execute(&mut conn).await?;
        }
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        Ok(sqlx::query(sql).execute(&mut conn).await?.rows_affected())
    }
}

/// Declare async tests that run once per backend: each `name` must be an
/// `async fn name(fresh: Fresh)` in the enclosing module.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::fresh_sqlite().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(fresh) = $crate::common::fresh_postgres().await {
                        super::$name(fresh).await;
                    }
                }
            )*
        }
    };
}

/// The 409 codes that tell a worker its lease is lost (claimed again or
/// altered, expired, released or retrying, finished, or never existed): its
/// answer to each is to drop the work.
pub const LEASE_LOST: [&str; 5] = [
    "lease_conflict",
    "lease_expired",
    "receipt_not_leased",
    "receipt_finished",
    "receipt_unknown",
];

/// A test's clock reading as the store takes it.
pub fn ms(value: u64) -> UnixMs {
    UnixMs::try_from(value).expect("test times fit a database integer")
}
