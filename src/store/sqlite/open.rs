//! Opening the SQLite store: create or migrate the file, read its binding,
//! open every reader, and start the writer thread.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::Notify;

use super::super::fair::Turn;
use super::super::{explain, rules};
use super::SqliteStore;
use super::group_commit::Writer;
use crate::domain::{SettlementStoreBinding, StoreError};
use crate::store::StoreResult;

impl SqliteStore {
    /// Open (creating if missing) and migrate the database at `url` (`sqlite:PATH`).
    pub async fn open(url: &str) -> StoreResult<Self> {
        // The writer and the readers are separate connections to one file.
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(StoreError::backend(
                "in-memory SQLite databases are not supported: use sqlite:PATH",
            ));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| {
                StoreError::backend(format!(
                    "invalid SQLite URL in --database-url: {}. Hint: use sqlite:PATH, e.g. \
                     sqlite:settled.db or sqlite:/var/lib/settled/settled.db",
                    explain::cause(&e)
                ))
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let path = options.get_filename().to_path_buf();
        let existed = path.exists();
        let digest = prepare(&options)
            .await
            .map_err(|cause| explain::sqlite(&path, &cause))?;
        if !existed {
            tracing::info!(path = %path.display(), "created SQLite database {}", path.display());
        }
        let reader = open_readers(options)
            .await
            .map_err(|e| explain::sqlite(&path, &explain::cause(&e)))?;
        Ok(Self {
            writer: Writer::start(path)?,
            reader,
            binding: SettlementStoreBinding::from_digest(digest),
            notify: Arc::new(Notify::new()),
            turn: Turn::default(),
        })
    }
}

/// How many readers serve reads beside the writer.
const READERS: u32 = 4;

/// Every reader, opened before the first request and kept for the life of
/// the process: a connection opened later fails when the process is out of
/// file descriptors (many idle clients), and the read waiting for it would
/// fail with it (an enqueue answered 503 while `/healthz` still served).
async fn open_readers(options: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePoolOptions::new()
        .min_connections(READERS)
        .max_connections(READERS)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    // Hold each until all are open, so every acquire opens a new one.
    let mut opened = Vec::new();
    for _ in 0..READERS {
        opened.push(pool.acquire().await?);
    }
    Ok(pool)
}

/// Create or migrate the file and read its binding (picked on first use);
/// a failure comes back as the database's own words, for [`explain::sqlite`].
async fn prepare(options: &SqliteConnectOptions) -> Result<[u8; 32], String> {
    let cause = |e: sqlx::Error| explain::cause(&e);
    let mut conn = options.connect().await.map_err(cause)?;
    let migrator = sqlx::migrate!("migrations/sqlite");
    let before = applied(&mut conn).await.map_err(cause)?;
    migrator
        .run(&mut conn)
        .await
        .map_err(|e| format!("migration failed: {}", explain::migrate_cause(&e)))?;
    let now_applied: Vec<String> = migrator
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{:04} {}", m.version, m.description))
        .collect();
    if !now_applied.is_empty() {
        tracing::info!(
            migrations = ?now_applied,
            "applied migrations {}",
            now_applied.join(", ")
        );
    }
    let binding = rules::new_binding().map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO store_identity (id, binding) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
    )
    .bind(binding.to_vec())
    .execute(&mut conn)
    .await
    .map_err(cause)?;
    let bytes: Vec<u8> = sqlx::query_scalar("SELECT binding FROM store_identity WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .map_err(cause)?;
    // Migrations ran on sqlx; from here on the synchronous writer owns writes.
    conn.close().await.map_err(cause)?;
    bytes
        .try_into()
        .map_err(|_| "the stored binding is not 32 bytes (a corrupt store_identity)".to_owned())
}

/// Versions of the migrations already applied (none in a new file).
async fn applied(conn: &mut sqlx::SqliteConnection) -> Result<Vec<i64>, sqlx::Error> {
    let present: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if present.is_none() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(conn)
        .await
}
