//! The per-minute series of `GET /v1/stats` (see `store::stats`): added by
//! the writer thread as a solo write of the next group commit, read by the
//! sqlx readers.

use rusqlite::Connection;
use rusqlite::types::Value;
use sqlx::SqlitePool;

use super::super::stats::{select_sql, upsert_sql};
use super::super::{StatsMinute, StoreResult};

/// Add each minute's deltas, then delete minutes before `keep_from`.
pub fn add(conn: &Connection, minutes: &[StatsMinute], keep_from: i64) -> StoreResult<()> {
    let mut upsert = conn.prepare_cached(&upsert_sql(|n| format!("?{n}")))?;
    for minute in minutes {
        let (minute_ms, counts, depth) = minute.params()?;
        let values = std::iter::once(Value::Integer(minute_ms))
            .chain(counts.into_iter().map(Value::Integer))
            .chain(std::iter::once(depth.map_or(Value::Null, Value::Integer)));
        upsert.execute(rusqlite::params_from_iter(values))?;
    }
    conn.prepare_cached("DELETE FROM stats_minutes WHERE minute_ms < ?1")?
        .execute([keep_from])?;
    Ok(())
}

/// Minutes in `[from, to)`, oldest first.
pub async fn read(pool: &SqlitePool, from: i64, to: i64) -> StoreResult<Vec<StatsMinute>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(select_sql("?1", "?2")))
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
    rows.iter().map(StatsMinute::from_row).collect()
}
