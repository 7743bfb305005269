//! The per-minute series of `GET /v1/stats` (see `store::stats`), which the
//! replicas of one database add to.

use sqlx::AssertSqlSafe;

use super::super::stats::{select_sql, upsert_sql};
use super::{PostgresStore, finish};
use crate::domain::UnixMs;
use crate::store::{StatsMinute, StoreResult};

impl PostgresStore {
    /// Add each minute's deltas, then delete minutes before `keep_from_ms`,
    /// in one transaction. Minutes are written in ascending order, so two
    /// replicas flushing the same minutes lock their rows in the same order
    /// and cannot deadlock.
    pub(super) async fn add_stat_minutes(
        &self,
        minutes: &[StatsMinute],
        keep_from_ms: UnixMs,
    ) -> StoreResult<()> {
        let keep_from = keep_from_ms.as_i64();
        let mut sorted = minutes.to_vec();
        sorted.sort_by_key(|m| m.minute_ms);
        let upsert = upsert_sql(|n| format!("${n}"));
        let mut tx = self.begin().await?;
        let result = async {
            for minute in &sorted {
                let (minute_ms, counts, depth) = minute.params()?;
                let mut query = sqlx::query(AssertSqlSafe(upsert.as_str())).bind(minute_ms);
                for count in counts {
                    query = query.bind(count);
                }
                query.bind(depth).execute(&mut *tx).await?;
            }
            sqlx::query("DELETE FROM stats_minutes WHERE minute_ms < $1")
                .bind(keep_from)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        .await;
        finish(tx, result).await
    }

    /// Minutes in `[from_ms, to_ms)`, oldest first.
    pub(super) async fn stat_minutes(
        &self,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> StoreResult<Vec<StatsMinute>> {
        let rows = sqlx::query(AssertSqlSafe(select_sql("$1", "$2")))
            .bind(from_ms.as_i64())
            .bind(to_ms.as_i64())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(StatsMinute::from_row).collect()
    }
}
