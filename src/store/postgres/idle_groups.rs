//! Forgetting idle groups on PostgreSQL (src/store/idle_groups.rs). An
//! enqueue registers its group with `ON CONFLICT DO NOTHING`, which takes no
//! lock on a row that exists: a delete judged on a snapshot that misses the
//! enqueue's receipt (not committed yet) would leave that receipt's group
//! unlisted. So a page is read and deleted under `SHARE ROW EXCLUSIVE` on
//! `receipt_groups`, which waits for every transaction that wrote to it
//! (enqueues, operators' limits, redrives) and keeps new ones out until
//! commit. The lock waits at most 100 ms (`begin_sweep`). Claims read the
//! groups and lock limited ones `FOR UPDATE`, which does not conflict; only
//! a claim spending a rate-limited group's tokens (an `UPDATE`) waits for a
//! page.

use super::super::idle_groups::{
    SweptGroups, forget_groups_sql, idle_groups_sql, idle_names, swept,
};
use super::tx::begin_sweep;
use super::{PostgresStore, finish};
use crate::store::StoreResult;

const IDLE_GROUPS: &str = idle_groups_sql!("receipts", "receipts", "$1", "$2");
const FORGET: &str = forget_groups_sql!("unnest($1::text[]) AS u (value)");

impl PostgresStore {
    pub(super) async fn sweep_idle_groups(
        &self,
        after: &str,
        limit: usize,
    ) -> StoreResult<SweptGroups> {
        let mut tx = begin_sweep(&self.pool).await?;
        let result: StoreResult<SweptGroups> = async {
            sqlx::query("LOCK TABLE receipt_groups IN SHARE ROW EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await?;
            let page: Vec<(String, bool)> = sqlx::query_as(IDLE_GROUPS)
                .bind(after)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            let idle = idle_names(&page);
            let forgotten = if idle.is_empty() {
                0
            } else {
                sqlx::query(FORGET)
                    .bind(&idle)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
            };
            Ok(swept(&page, forgotten, limit))
        }
        .await;
        finish(tx, result).await
    }
}

#[cfg(test)]
#[path = "idle_groups_tests.rs"]
mod tests;
