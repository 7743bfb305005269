//! What PostgreSQL writes for one phase of a run: the WAL it generated
//! (`pg_current_wal_lsn()` before and after; the whole server's, so run it
//! on a quiet server) and the index entries its row changes made, counted
//! from `pg_stat_user_tables` as each inserted row and each update that was
//! not HOT adding one entry to every index of its table. Partial indexes are
//! counted as if every row went into them, so that figure is an upper bound.

use sqlx::{Connection, PgConnection};

/// A snapshot at the start of a phase.
pub struct PgCost {
    conn: PgConnection,
    lsn: String,
    tables: Vec<TableStat>,
}

/// What one phase wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub wal_bytes: f64,
    pub index_entries: f64,
    pub rows_inserted: f64,
    pub rows_updated: f64,
    pub hot_updates: f64,
    /// The WAL positions before and after (`FROM-TO`), to read the records
    /// themselves with `pg_waldump` (`bench/pg_wal_records.py`).
    pub wal_range: String,
    /// The database's relations by file number (`pg_waldump` names them so).
    pub relations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct TableStat {
    name: String,
    inserted: i64,
    updated: i64,
    hot: i64,
    indexes: i64,
}

async fn tables(conn: &mut PgConnection) -> Option<Vec<TableStat>> {
    // Counters reach the shared statistics within a second of a transaction's end.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .ok()?;
    sqlx::query_as(
        "SELECT s.schemaname || '.' || s.relname AS name, s.n_tup_ins AS inserted, \
         s.n_tup_upd AS updated, s.n_tup_hot_upd AS hot, \
         (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid) AS indexes \
         FROM pg_stat_user_tables s",
    )
    .fetch_all(conn)
    .await
    .ok()
}

impl PgCost {
    /// Start measuring the database at `url` (`None` if not PostgreSQL).
    pub async fn start(url: &str) -> Option<Self> {
        if !url.starts_with("postgres") {
            return None;
        }
        let mut conn = PgConnection::connect(url).await.ok()?;
        let lsn = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let tables = tables(&mut conn).await?;
        Some(Self { conn, lsn, tables })
    }

    /// What was written since `start`.
    pub async fn finish(mut self) -> Option<Written> {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let (wal, end): (f64, String) = sqlx::query_as(
            "SELECT (pg_current_wal_lsn() - $1::pg_lsn)::float8, pg_current_wal_lsn()::text",
        )
        .bind(&self.lsn)
        .fetch_one(&mut self.conn)
        .await
        .ok()?;
        let after = tables(&mut self.conn).await?;
        let relations: Vec<(String, String)> = sqlx::query_as(
            "SELECT (SELECT oid FROM pg_database WHERE datname = current_database())::text \
             || '/' || c.relfilenode::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
             AND c.relfilenode <> 0",
        )
        .fetch_all(&mut self.conn)
        .await
        .ok()?;
        let _ = self.conn.close().await;
        let mut written = Written {
            wal_bytes: wal,
            wal_range: format!("{}-{end}", self.lsn),
            relations: relations.into_iter().collect(),
            ..Written::default()
        };
        for t in &after {
            let before = self.tables.iter().find(|b| b.name == t.name);
            let delta = |f: fn(&TableStat) -> i64| (f(t) - before.map_or(0, f)) as f64;
            let (ins, upd, hot) = (
                delta(|s| s.inserted),
                delta(|s| s.updated),
                delta(|s| s.hot),
            );
            written.rows_inserted += ins;
            written.rows_updated += upd;
            written.hot_updates += hot;
            written.index_entries += (ins + upd - hot) * t.indexes as f64;
        }
        Some(written)
    }
}
