//! Pick the backend once, from the URL scheme.

use super::SharedStore;
use super::postgres::{PostgresOptions, PostgresStore};
use super::sqlite::SqliteStore;
use crate::domain::SettlementRouteError;

/// Open the store named by `url`: `sqlite:PATH` or `postgres://…`.
pub async fn open_store(
    url: &str,
    pg: &PostgresOptions,
) -> Result<SharedStore, SettlementRouteError> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        PostgresStore::open(url, pg).await
    } else {
        Err(SettlementRouteError::backend(
            "unknown database URL scheme: use sqlite:PATH or postgres://USER@HOST/DB",
        ))
    }
}
