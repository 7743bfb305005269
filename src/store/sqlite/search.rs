//! Finding receipts on the reader pool: each index range of the plan
//! (src/store/search.rs) read from one snapshot, forced with `INDEXED BY`
//! so that a statement that cannot use its index fails instead of scanning.

use sqlx::SqlitePool;

use super::super::rows::ReceiptRow;
use super::super::search::{self, Bind, Dialect};
use super::super::*;

/// One page of a search at `now` (ms).
pub async fn find(
    pool: &SqlitePool,
    filter: &ReceiptFilter,
    page: &SearchPage,
    now: i64,
) -> StoreResult<SearchResults> {
    let budget = filter.budget(page.limit);
    let mut tx = pool.begin().await?;
    let mut per_source = Vec::new();
    for source in filter.sources() {
        let s = search::statement(Dialect::Sqlite, source, filter, page, now, budget)?;
        let mut query = sqlx::query_as::<_, ReceiptRow>(sqlx::AssertSqlSafe(s.sql));
        for value in s.binds {
            query = match value {
                Bind::Int(v) => query.bind(v),
                Bind::Text(t) => query.bind(t),
            };
        }
        per_source.push(query.fetch_all(&mut *tx).await?);
    }
    tx.commit().await?;
    search::assemble(filter, page, now, budget, per_source)
}
