//! Pick the backend once, from the URL scheme.

use super::SharedStore;
use super::postgres::{PostgresOptions, PostgresStore};
use super::sqlite::SqliteStore;
use crate::domain::StoreError;

/// Why no store was opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL names no backend: a configuration error, said with a hint.
    #[error("{0}")]
    Scheme(String),
    /// The backend could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Open the store named by `url`: `sqlite:PATH`, `postgres://…`, or
/// libpq's keyword/value form (`host=h1,h2 dbname=…`).
pub async fn open_store(url: &str, pg: &PostgresOptions) -> Result<SharedStore, OpenError> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://")
        || url.starts_with("postgresql://")
        || super::postgres::is_keyword_form(url)
    {
        Ok(PostgresStore::open(url, pg).await?)
    } else {
        // Only the scheme is repeated: the rest of a URL may hold a password.
        let problem = match url.split_once(':') {
            Some((scheme, _)) => format!("unknown database URL scheme `{scheme}:`"),
            None => format!("no scheme in database URL `{url}` (did you mean sqlite:{url}?)"),
        };
        Err(OpenError::Scheme(format!(
            "{problem} in --database-url. Hint: use sqlite:PATH (e.g. sqlite:settled.db, created \
             if missing) or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )))
    }
}
