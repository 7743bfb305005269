//! PostgreSQL's CPU for one database: the backends serving it, read from
//! `/proc` (so only when the server runs on this machine). Background
//! processes (WAL writer, checkpointer) are shared by every database and left out.

use std::collections::HashMap;

use sqlx::{Connection, PgConnection};

use super::cpu;

/// The backends' CPU at the start of a phase, and the connection that asks.
pub struct DbCpu {
    conn: PgConnection,
    before: HashMap<i32, f64>,
}

/// CPU seconds of every backend of the database `conn` is connected to, but its own.
async fn backends(conn: &mut PgConnection) -> Option<HashMap<i32, f64>> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(conn)
    .await
    .ok()?;
    let cpu: HashMap<i32, f64> = pids
        .into_iter()
        .filter_map(|pid| Some((pid, cpu::cpu_s(Some(u32::try_from(pid).ok()?))?)))
        .collect();
    // None of them readable: the server is elsewhere.
    (!cpu.is_empty()).then_some(cpu)
}

impl DbCpu {
    /// Start measuring the backends of the database at `url` (`None` if not PostgreSQL or not local).
    pub async fn start(url: &str) -> Option<Self> {
        if !url.starts_with("postgres") {
            return None;
        }
        let mut conn = PgConnection::connect(url).await.ok()?;
        let before = backends(&mut conn).await?;
        Some(Self { conn, before })
    }

    /// CPU seconds the backends used since `start`; a backend that came and
    /// went in between is missed, one that came counts from its start.
    pub async fn finish(mut self) -> Option<f64> {
        let after = backends(&mut self.conn).await?;
        let _ = self.conn.close().await;
        Some(
            after
                .iter()
                .map(|(pid, s)| s - self.before.get(pid).copied().unwrap_or(0.0))
                .sum(),
        )
    }
}
