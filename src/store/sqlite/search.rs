//! Finding receipts on the reader pool: the plan's one statement
//! (src/store/search.rs), each arm forced onto its index with `INDEXED BY`
//! so that a statement that cannot use it fails instead of scanning.

use sqlx::SqlitePool;

use super::super::rows::ReceiptRow;
use super::super::search::{self, Bind, Dialect};
use crate::store::{ReceiptFilter, SearchPage, SearchResults, StoreResult};

/// One page of a search at `now` (ms).
pub async fn find(
    pool: &SqlitePool,
    filter: &ReceiptFilter,
    page: &SearchPage,
    now: i64,
) -> StoreResult<SearchResults> {
    let budget = filter.budget(page.limit);
    let mut rows = Vec::new();
    if let Some(s) = search::statement(Dialect::Sqlite, filter, page, now, budget)? {
        let mut query = sqlx::query_as::<_, ReceiptRow>(sqlx::AssertSqlSafe(s.sql));
        for value in s.binds {
            query = match value {
                Bind::Int(v) => query.bind(v),
                Bind::Text(t) => query.bind(t),
            };
        }
        rows = query.fetch_all(pool).await?;
    }
    search::assemble(filter, page, now, budget, rows)
}
