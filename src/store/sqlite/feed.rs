//! The history feed on SQLite (see [`crate::store::feed`]): one writer, so
//! `receipt_history.id` order is commit order and a position is `(0, id)`.
//! Reads run on the reader pool in one snapshot; the purge that raises the
//! horizon runs on the writer (see [`purge`]).

use rusqlite::Connection;
use sqlx::SqliteConnection;

use super::super::feed::{FEED_COLUMNS, FeedRow, FeedSource};
use super::super::rows::{to_i64, to_u64};
use super::lookup::json;
use crate::store::{FeedPosition, StoreResult};

/// Feed reads on one reader connection, inside a transaction (one snapshot).
pub struct Reader<'c>(pub &'c mut SqliteConnection);

impl FeedSource for Reader<'_> {
    async fn horizon(&mut self) -> StoreResult<FeedPosition> {
        let id: i64 = sqlx::query_scalar("SELECT entry_id FROM history_horizon WHERE id = 1")
            .fetch_one(&mut *self.0)
            .await?;
        position(id)
    }

    async fn tip(&mut self) -> StoreResult<FeedPosition> {
        let id: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM receipt_history")
            .fetch_one(&mut *self.0)
            .await?;
        position(id.unwrap_or(0))
    }

    async fn rows(&mut self, after: FeedPosition, limit: usize) -> StoreResult<Vec<FeedRow>> {
        let sql = format!(
            "SELECT 0 AS tx, {FEED_COLUMNS} FROM receipt_history WHERE id > ?1 ORDER BY id LIMIT ?2"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(to_i64(after.id, "cursor")?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.0)
            .await?)
    }

    async fn rows_back(
        &mut self,
        after: FeedPosition,
        upto: FeedPosition,
        limit: usize,
    ) -> StoreResult<Vec<FeedRow>> {
        let sql = format!(
            "SELECT 0 AS tx, {FEED_COLUMNS} FROM receipt_history WHERE id > ?1 AND id <= ?2 \
             ORDER BY id DESC LIMIT ?3"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(to_i64(after.id, "cursor")?)
            .bind(to_i64(upto.id, "cursor")?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.0)
            .await?)
    }
}

fn position(id: i64) -> StoreResult<FeedPosition> {
    Ok(FeedPosition {
        tx: 0,
        id: to_u64(id, "history id")?,
    })
}

/// Delete up to `limit` receipts finished before `before` (their history
/// follows by cascade), raising the feed's horizon to the newest entry
/// deleted, in the writer's transaction.
///
/// The receipt that owns the newest history entry is kept (until a newer
/// entry exists): without AUTOINCREMENT, SQLite would give its id to the
/// next entry, behind positions readers already hold.
pub fn purge(conn: &Connection, before: i64, limit: usize) -> StoreResult<u64> {
    let ids: Vec<String> = conn
        .prepare_cached(
            "SELECT receipt_id FROM receipts WHERE status IN ('settled', 'skipped') \
             AND finished_at_ms < ?1 AND receipt_id IS NOT \
             (SELECT receipt_id FROM receipt_history ORDER BY id DESC LIMIT 1) \
             LIMIT CAST(?2 AS INTEGER)",
        )?
        .query_map(
            rusqlite::params![before, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(0);
    }
    let ids = json(&ids)?;
    conn.prepare_cached(
        "UPDATE history_horizon SET entry_id = max(entry_id, coalesce((SELECT max(id) \
         FROM receipt_history WHERE receipt_id IN (SELECT value FROM json_each(?1))), 0)) \
         WHERE id = 1",
    )?
    .execute([&ids])?;
    let deleted = conn
        .prepare_cached(
            "DELETE FROM receipts WHERE receipt_id IN (SELECT value FROM json_each(?1))",
        )?
        .execute([&ids])?;
    Ok(deleted as u64)
}
