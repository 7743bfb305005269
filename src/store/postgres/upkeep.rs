//! Upkeep done by one replica for all: keeping the receipts table vacuumed
//! while it churns, and the retention passes (src/retention.rs). The
//! replica whose upkeep connection holds the upkeep lock (a PostgreSQL
//! advisory lock, taken once a second by whichever replica finds it free)
//! does them; when its connection goes, its process with it, another
//! replica takes the lock within a second or so. So N replicas cost the
//! database one look a second and one vacuum or retention pass, not N.
//! With `--advertise-url` the holder also says where it listens
//! (`upkeep_holder`, migrations/postgres/0021_upkeep_holder.sql), and the
//! other replicas send it their claims and outcomes (src/http/forward.rs).
//!
//! Every claim and every outcome leaves a dead row version behind, and its
//! index entries stay until a `VACUUM` removes them: claims and
//! `/v1/status` start their scans at the head of their indexes, where those
//! entries pile up, and step over each of them. Autovacuum's default
//! trigger (a fifth of the table dead, looked at once a minute) comes late
//! for a queue, and it may be off; so the upkeep replica looks once a
//! second and vacuums the table when its dead row versions reach both
//! `--pg-vacuum-dead-rows` and a tenth of its live rows (docs/deployment.md,
//! "Vacuum"). `SKIP_LOCKED`: a vacuum of autovacuum's or an operator's is
//! not queued behind. The connection moves when the writer changes (a
//! standby cannot vacuum).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sqlx::Executor;
use sqlx::postgres::PgPool;
use tokio::task::AbortHandle;

use super::primary::Primary;

/// The first key of the upkeep lock; the second names the schema, so that
/// deployments in schemas of their own (`--pg-schema`) in one database each
/// have their own upkeep.
const UPKEEP_CLASS: i32 = 0x5e78;

/// How often the lock is looked at and the dead row versions are counted
/// (a read of the statistics, not of the table).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// After a failure, the next look waits this long (one warning each time).
const AFTER_FAILURE: Duration = Duration::from_secs(60);

/// This replica's upkeep: whether it holds the upkeep lock, and the task
/// that takes it and vacuums.
pub(super) struct Upkeep {
    seen: Arc<Seen>,
    task: AbortHandle,
}

/// What the last look saw.
#[derive(Default)]
struct Seen {
    mine: AtomicBool,
    /// Held and advertised: the others send their claims and outcomes here.
    leading: Arc<AtomicBool>,
    /// Where the holder takes claims and outcomes, when another replica
    /// holds the lock and advertised a URL.
    holder_url: RwLock<Option<String>>,
}

impl Seen {
    fn lost(&self) {
        self.mine.store(false, Ordering::Relaxed);
        self.leading.store(false, Ordering::Relaxed);
        self.set_url(None);
    }

    fn set_url(&self, url: Option<String>) {
        if let Ok(mut held) = self.holder_url.write() {
            *held = url;
        }
    }
}

impl Upkeep {
    /// Whether this replica does the upkeep now.
    pub fn mine(&self) -> bool {
        self.seen.mine.load(Ordering::Relaxed)
    }

    /// Where another replica, the holder, takes claims and outcomes.
    pub fn holder_url(&self) -> Option<String> {
        self.seen.holder_url.read().ok()?.clone()
    }
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        // Ending the task closes its connection, which gives the lock back.
        self.task.abort();
    }
}

/// Start taking the upkeep lock; vacuum `receipts` when at least `dead_rows`
/// of its row versions are dead (never when 0: left to autovacuum).
/// `options.advertise_url`: where this replica takes the others' claims and
/// outcomes while it holds the lock; `leading` is set while it does (the
/// write queues then take no turns).
pub(super) fn start(
    primary: Arc<Primary>,
    options: &super::PostgresOptions,
    leading: Arc<AtomicBool>,
) -> Upkeep {
    let dead_rows = i64::try_from(options.vacuum_dead_rows).unwrap_or(i64::MAX);
    let seen = Arc::new(Seen {
        leading,
        ..Seen::default()
    });
    let looks = Looks {
        dead_rows,
        advertise: options.advertise_url.clone(),
        key: super::schema::lock_key(&options.schema),
        seen: seen.clone(),
    };
    let task = tokio::spawn(run(primary, looks)).abort_handle();
    Upkeep { seen, task }
}

/// What each look needs.
struct Looks {
    dead_rows: i64,
    advertise: Option<String>,
    /// The lock's second key (`schema::lock_key`).
    key: i32,
    seen: Arc<Seen>,
}

/// A connection of its own, opened at the first look and kept: it holds the
/// lock, a vacuum must not hold one of the store's, and it runs without the
/// requests' `statement_timeout` (a large table takes longer). The server
/// gives it up within about half a minute of its host going silent (its
/// own keepalives; by default it would take hours), which frees the lock.
fn kept_pool(primary: &Arc<Primary>) -> PgPool {
    super::one_kept_connection(
        primary,
        Some(
            "SET statement_timeout = 0; SET tcp_keepalives_idle = 10; \
             SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3",
        ),
    )
    .connect_lazy_with(primary.options())
}

/// A new connection in place of `pool`'s, which is closed, and with it the
/// lock it may hold.
fn renew(pool: &mut PgPool, primary: &Arc<Primary>, seen: &Seen) {
    seen.lost();
    let old = std::mem::replace(pool, kept_pool(primary));
    tokio::spawn(async move { old.close().await });
}

async fn run(primary: Arc<Primary>, looks: Looks) {
    let mut generation = primary.generation();
    let mut pool = kept_pool(&primary);
    // The first look at once: a replica that starts does the upkeep, or
    // learns which one does, within moments.
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(LOOK_EVERY).await;
        }
        if generation.has_changed().unwrap_or(false) {
            generation.mark_unchanged();
            renew(&mut pool, &primary, &looks.seen);
        }
        if let Err(error) = look(&pool, &looks).await {
            // A new connection: the lock goes with the old one, so that
            // another replica does the upkeep meanwhile.
            renew(&mut pool, &primary, &looks.seen);
            tracing::warn!(%error, "cannot do the upkeep (vacuum, retention); trying again in a minute");
            tokio::time::sleep(AFTER_FAILURE).await;
        }
    }
}

/// Whether this connection holds the upkeep lock, taking it if it is free
/// (held already: not taken again, which would stack it), the dead and live
/// row versions, and the URL the holder wrote, if the connection that wrote
/// it holds the lock and beat within the last 3 s (three looks: a holder
/// whose process stalled is passed over). A connection the pool
/// opened again after a failure holds nothing, which the lock table says.
/// The holder's own look renews its beat (the row names its connection).
const LOOK: &str = "WITH beat AS (UPDATE upkeep_holder SET beat_at = clock_timestamp() \
       WHERE pid = pg_backend_pid()) \
     SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
       AND pid = pg_backend_pid() AND granted AND classid = $1 AND objid = $2 AND objsubid = 2) \
     THEN true ELSE pg_try_advisory_lock($1, $2) END, \
     pg_stat_get_dead_tuples('receipts'::regclass), pg_stat_get_live_tuples('receipts'::regclass), \
     (SELECT h.url FROM upkeep_holder AS h JOIN pg_locks AS l ON l.pid = h.pid \
       WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
       AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database \
         WHERE datname = current_database()) \
       AND h.beat_at > clock_timestamp() - interval '3 seconds')";

/// The holder's row: where it takes claims and outcomes (none without
/// `--advertise-url`), and its connection's pid.
const HOLDER: &str = "INSERT INTO upkeep_holder (url, pid) VALUES ($1, pg_backend_pid()) \
     ON CONFLICT (only_row) DO UPDATE SET url = excluded.url, pid = excluded.pid, \
       beat_at = clock_timestamp()";

async fn look(pool: &PgPool, looks: &Looks) -> sqlx::Result<()> {
    let (held, dead, live, url): (bool, i64, i64, Option<String>) = sqlx::query_as(LOOK)
        .bind(UPKEEP_CLASS)
        .bind(looks.key)
        .fetch_one(pool)
        .await?;
    if looks.seen.mine.swap(held, Ordering::Relaxed) != held {
        tracing::info!(
            held,
            "this replica's turn at the upkeep (vacuum, retention) changed"
        );
    }
    if held && url != looks.advertise {
        sqlx::query(HOLDER)
            .bind(&looks.advertise)
            .execute(pool)
            .await?;
    }
    looks.seen.set_url(url.filter(|_| !held));
    let leading = held && looks.advertise.is_some();
    looks.seen.leading.store(leading, Ordering::Relaxed);
    let dead_rows = looks.dead_rows;
    if !held || dead_rows == 0 || dead < dead_rows.max(live / 10) {
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
