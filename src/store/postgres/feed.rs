//! The history feed on PostgreSQL (see [`crate::store::feed`] and migration
//! 0008): a position is `(tx, id)`, the writing transaction's id and the
//! entry's id, and only entries of transactions older than every
//! transaction still running are served, so that one committing late can
//! never land behind a position already served, whichever replica wrote it.

use sqlx::PgConnection;

use super::super::feed::{FEED_COLUMNS, FeedRow, FeedSource};
use super::super::rows::{to_i64, to_u64};
use super::{PostgresStore, finish};
use crate::store::{FeedPosition, FeedRead, FeedStart, StoreResult};

/// Transactions below this id have all ended, as of the statement's snapshot.
/// (Queries order by `h.tx`: a bare `tx` would name the output column, the
/// `bigint` copy, which the index cannot deliver in order.)
const SETTLED_BELOW: &str = "pg_snapshot_xmin(pg_current_snapshot())";

/// Feed reads on one connection inside a repeatable-read transaction, so
/// the horizon, the tip and the rows come from one snapshot.
struct Reader<'c>(&'c mut PgConnection);

impl FeedSource for Reader<'_> {
    async fn horizon(&mut self) -> StoreResult<FeedPosition> {
        let (tx, id): (i64, i64) =
            sqlx::query_as("SELECT tx::text::bigint, entry_id FROM history_horizon WHERE id = 1")
                .fetch_one(&mut *self.0)
                .await?;
        position(tx, id)
    }

    async fn tip(&mut self) -> StoreResult<FeedPosition> {
        let sql = format!(
            "SELECT tx::text::bigint, id FROM receipt_history AS h WHERE tx < {SETTLED_BELOW} \
             ORDER BY h.tx DESC, h.id DESC LIMIT 1"
        );
        let newest: Option<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_optional(&mut *self.0)
            .await?;
        newest.map_or(Ok(FeedPosition::START), |(tx, id)| position(tx, id))
    }

    async fn rows(&mut self, after: FeedPosition, limit: usize) -> StoreResult<Vec<FeedRow>> {
        let sql = format!(
            "SELECT tx::text::bigint AS tx, {FEED_COLUMNS} FROM receipt_history AS h \
             WHERE (h.tx, h.id) > ($1::text::xid8, $2) AND h.tx < {SETTLED_BELOW} \
             ORDER BY h.tx, h.id LIMIT $3"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(to_i64(after.tx, "cursor")?.to_string())
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
            "SELECT tx::text::bigint AS tx, {FEED_COLUMNS} FROM receipt_history AS h \
             WHERE (h.tx, h.id) > ($1::text::xid8, $2) AND (h.tx, h.id) <= ($3::text::xid8, $4) \
             AND h.tx < {SETTLED_BELOW} ORDER BY h.tx DESC, h.id DESC LIMIT $5"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(to_i64(after.tx, "cursor")?.to_string())
            .bind(to_i64(after.id, "cursor")?)
            .bind(to_i64(upto.tx, "cursor")?.to_string())
            .bind(to_i64(upto.id, "cursor")?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *self.0)
            .await?)
    }
}

fn position(tx: i64, id: i64) -> StoreResult<FeedPosition> {
    Ok(FeedPosition {
        tx: to_u64(tx, "history tx")?,
        id: to_u64(id, "history id")?,
    })
}

impl PostgresStore {
    /// One feed read in one snapshot.
    pub(super) async fn feed_page(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        let mut tx = self.begin_read().await?;
        let read = super::super::feed::read(&mut Reader(&mut tx), start, limit).await;
        finish(tx, read).await
    }

    /// Delete up to `limit` receipts finished before `before` (history
    /// follows by cascade) and raise the feed's horizon to the newest entry
    /// deleted, in one statement. Concurrent purges (other replicas) queue
    /// on the horizon row, and each raises it only upward. The receipt that
    /// owns the newest entry is kept, as on SQLite (where it must be: see
    /// `sqlite::feed::purge`), so that both backends remove the same.
    pub(super) async fn purge_with_horizon(&self, before: i64, limit: usize) -> StoreResult<u64> {
        // SKIP LOCKED keeps retention out of the way of anything holding a row.
        let purge = sqlx::query_scalar(
            "WITH picked AS MATERIALIZED (SELECT receipt_id FROM receipts \
                 WHERE status IN ('settled', 'skipped') AND finished_at_ms < $1 \
                 AND receipt_id IS DISTINCT FROM (SELECT receipt_id FROM receipt_history \
                     ORDER BY tx DESC, id DESC LIMIT 1) \
                 LIMIT $2 FOR UPDATE SKIP LOCKED), \
             newest AS (SELECT tx, id FROM receipt_history \
                 WHERE receipt_id IN (SELECT receipt_id FROM picked) \
                 ORDER BY tx DESC, id DESC LIMIT 1), \
             raised AS (UPDATE history_horizon AS h SET tx = n.tx, entry_id = n.id \
                 FROM newest AS n WHERE h.id = 1 AND (n.tx, n.id) > (h.tx, h.entry_id) \
                 RETURNING 1), \
             deleted AS (DELETE FROM receipts WHERE receipt_id IN (SELECT receipt_id FROM picked) \
                 RETURNING 1) \
             SELECT count(*) FROM deleted",
        )
        .bind(before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        // Bounded by the caller (`purge_finished`), like every store call.
        let deleted: i64 = purge.fetch_one(&self.pool).await?;
        to_u64(deleted, "purged count")
    }
}
