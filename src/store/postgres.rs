//! PostgreSQL backend (not yet implemented).

use super::*;

/// Pool and timeout settings for PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub max_connections: u32,
    pub connect_timeout_ms: u64,
    pub statement_timeout_ms: u64,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            connect_timeout_ms: 5_000,
            statement_timeout_ms: 5_000,
        }
    }
}

/// The PostgreSQL store.
pub struct PostgresStore;

impl PostgresStore {
    /// Not available yet.
    pub async fn open(_url: &str, _options: &PostgresOptions) -> StoreResult<SharedStore> {
        Err(SettlementRouteError::backend(
            "the PostgreSQL backend is not implemented yet",
        ))
    }
}
