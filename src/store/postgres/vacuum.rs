//! Keeping the receipts table vacuumed while it churns. Every claim and every
//! outcome leaves a dead row version behind, and its index entries stay until
//! a `VACUUM` removes them: claims and `/v1/status` start their scans at the
//! head of their indexes, where those entries pile up, and step over each of
//! them. Autovacuum's default trigger (a fifth of the table dead, looked at
//! once a minute) comes late for a queue, and it may be off; so each replica
//! looks once a second and vacuums the table when its dead row versions
//! reach both `--pg-vacuum-dead-rows` and a tenth of its live rows
//! (docs/deployment.md, "Vacuum"). `SKIP_LOCKED`: while one replica
//! vacuums, the others skip instead of queueing behind it. Its connection
//! moves when the writer changes (a standby cannot vacuum).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Executor;
use sqlx::postgres::PgPool;
use tokio::task::AbortHandle;

use super::primary::Primary;

/// How often the dead row versions are counted (a read of the statistics,
/// not of the table).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// After a failure, the next look waits this long (one warning each time).
const AFTER_FAILURE: Duration = Duration::from_secs(60);

/// Start vacuuming `receipts` when at least `dead_rows` of its row versions
/// are dead; `None` when `dead_rows` is 0 (left to autovacuum).
pub(super) fn start(primary: Arc<Primary>, dead_rows: u64) -> Option<AbortHandle> {
    let dead_rows = i64::try_from(dead_rows).unwrap_or(i64::MAX);
    if dead_rows == 0 {
        return None;
    }
    Some(tokio::spawn(run(primary, dead_rows)).abort_handle())
}

/// A connection of its own, opened at the first look and kept: a vacuum
/// must not hold one of the store's, and it runs without the requests'
/// `statement_timeout` (a large table takes longer).
fn kept_pool(primary: &Arc<Primary>) -> PgPool {
    super::one_kept_connection(primary, Some("SET statement_timeout = 0"))
        .connect_lazy_with(primary.options())
}

async fn run(primary: Arc<Primary>, dead_rows: i64) {
    let mut generation = primary.generation();
    let mut pool = kept_pool(&primary);
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        if generation.has_changed().unwrap_or(false) {
            generation.mark_unchanged();
            let old = std::mem::replace(&mut pool, kept_pool(&primary));
            tokio::spawn(async move { old.close().await });
        }
        if let Err(error) = look(&pool, dead_rows).await {
            tracing::warn!(%error, "cannot vacuum the receipts table; trying again in a minute");
            tokio::time::sleep(AFTER_FAILURE).await;
        }
    }
}

async fn look(pool: &PgPool, dead_rows: i64) -> sqlx::Result<()> {
    let (dead, live): (i64, i64) = sqlx::query_as(
        "SELECT pg_stat_get_dead_tuples('receipts'::regclass), \
                pg_stat_get_live_tuples('receipts'::regclass)",
    )
    .fetch_one(pool)
    .await?;
    if dead < dead_rows.max(live / 10) {
        return Ok(());
    }
    let started = Instant::now();
    vacuum(pool).await?;
    tracing::debug!(
        dead,
        live,
        took_ms = started.elapsed().as_millis() as u64,
        "vacuumed the receipts table"
    );
    Ok(())
}

async fn vacuum(pool: &PgPool) -> sqlx::Result<()> {
    // Not in a transaction (VACUUM refuses one): a simple query of its own.
    // No truncation of empty pages at the end of the table: it would take
    // the table's exclusive lock, stalling requests (and standbys' reads)
    // for space a queue's table soon fills again.
    pool.execute(sqlx::raw_sql(
        "VACUUM (SKIP_LOCKED, TRUNCATE false) receipts",
    ))
    .await?;
    Ok(())
}
