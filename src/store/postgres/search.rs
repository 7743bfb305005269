//! Finding receipts: each index range of the plan (src/store/search.rs)
//! read from one snapshot, as on SQLite.

use super::super::rows::to_i64;
use super::super::search::{self, Bind, Dialect, Source};
use super::*;

impl PostgresStore {
    pub(super) async fn find_page(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: u64,
    ) -> StoreResult<SearchResults> {
        let now = to_i64(now_ms, "now_ms")?;
        let budget = filter.budget(page.limit);
        let mut tx = self.begin_read().await?;
        let mut per_source = Vec::new();
        for source in filter.sources() {
            // No stored owner holds a NUL, which PostgreSQL text cannot carry.
            if source == Source::Leases && !filter.owner.as_deref().is_none_or(storable) {
                per_source.push(Vec::new());
                continue;
            }
            let s = search::statement(Dialect::Postgres, source, filter, page, now, budget)?;
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
}
