//! Finding receipts: the plan's one statement (src/store/search.rs), as on
//! SQLite.

use super::super::search::{self, Bind, Dialect};
use super::PostgresStore;
use crate::domain::UnixMs;
use crate::store::rows::ReceiptRow;
use crate::store::{ReceiptFilter, SearchPage, SearchResults, StoreResult};

impl PostgresStore {
    pub(super) async fn find_page(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults> {
        let now = now_ms.as_i64();
        let budget = filter.budget(page.limit);
        let mut rows = Vec::new();
        let statement = search::statement(Dialect::Postgres, filter, page, now, budget)?;
        if let Some(s) = statement {
            let mut query = sqlx::query_as::<_, ReceiptRow>(sqlx::AssertSqlSafe(s.sql));
            for value in s.binds {
                query = match value {
                    Bind::Int(v) => query.bind(v),
                    Bind::Text(t) => query.bind(t),
                };
            }
            rows = self.read_all(query).await?;
        }
        search::assemble(filter, page, now, budget, rows)
    }
}
