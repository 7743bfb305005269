//! Opening the PostgreSQL store: find the writer, migrate, build the pool
//! (its connections following the writer), read the binding, and start the
//! listener, the write and claim queues and the upkeep.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use tokio::sync::Notify;

use super::super::fair::Turn;
use super::super::{explain, rules};
use super::schema::{self, DEFAULT_SCHEMA, conn_info, prepare};
use super::{PostgresStore, batcher, claim_batch, keepalive, kept, listen, primary, upkeep};
use crate::domain::{SettlementStoreBinding, StoreError};
use crate::store::{SharedStore, StoreResult};

/// Pool and timeout settings for PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Pool size (the `LISTEN` connection comes on top).
    pub max_connections: u32,
    /// How long to wait for a connection, new or pooled, before failing.
    pub connect_timeout_ms: u64,
    /// `statement_timeout` of every pooled connection; 0 disables it.
    pub statement_timeout_ms: u64,
    /// The schema holding settled's tables, created if missing.
    pub schema: String,
    /// Vacuum the receipts table once this many of its row versions (and a
    /// tenth of its live rows) are dead; 0 leaves it to autovacuum.
    pub vacuum_dead_rows: u64,
    /// Give up on a server that stops answering without a reset after about
    /// this long (TCP keepalives, `TCP_USER_TIMEOUT`); 0 leaves the system's.
    pub tcp_timeout_ms: u64,
    /// Where this replica takes the other replicas' claims and outcomes while
    /// it does the upkeep (src/store/postgres/upkeep.rs); none: it takes none.
    pub advertise_url: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            connect_timeout_ms: 5_000,
            statement_timeout_ms: 5_000,
            schema: DEFAULT_SCHEMA.to_owned(),
            vacuum_dead_rows: 20_000,
            tcp_timeout_ms: 10_000,
            advertise_url: None,
        }
    }
}
/// How many groups each queue (writes, batch claims) of one replica may run
/// at a time: an eighth of the pool, 1 to 4 (2 at the default pool of 16).
/// The first runs whatever is queued; the others only while a large backlog
/// waits (`batcher`), so that small requests queue and merge into few
/// statements while batches still use the database's cores side by side.
/// Against two groups that both took every request this settles more one
/// by one for less database CPU each, with a lower p99, and batches as fast
/// (one group alone was slower batched; docs/perf-log/postgres-write-path.md, "One group per
/// queue"). A larger pool (for a larger database server) runs more.
fn write_tasks(max_connections: u32) -> usize {
    usize::try_from(max_connections / 8).map_or(1, |n| n.clamp(1, WRITE_TASKS))
}

const WRITE_TASKS: usize = 4;
impl PostgresStore {
    /// Connect to `url` (`postgres://…`), migrate, and start listening for
    /// other replicas' wakeups.
    pub async fn open(url: &str, options: &PostgresOptions) -> StoreResult<SharedStore> {
        Ok(Arc::new(Self::connect(url, options).await?))
    }

    /// [`PostgresStore::open`], returning the concrete store.
    pub async fn connect(url: &str, options: &PostgresOptions) -> StoreResult<Self> {
        let info = conn_info(url, &options.schema)?;
        let acquire_timeout = Duration::from_millis(options.connect_timeout_ms);
        let statement_timeout = options.statement_timeout_ms;
        let tcp = info.tcp_timeouts(keepalive::TcpTimeouts::within(Duration::from_millis(
            options.tcp_timeout_ms,
        )));
        let single = info.hosts.len() == 1;
        let primary = primary::Primary::new(
            info.hosts,
            info.connect_timeout.unwrap_or(acquire_timeout),
            tcp,
        );
        // With one host, its own connection error (in words) is the message;
        // with several, the search says what each one answered.
        if !single {
            primary.find_at_start().await.map_err(|said| {
                StoreError::backend(format!(
                    "no PostgreSQL server in --database-url accepts writes: {said}"
                ))
            })?;
        }
        let connect = primary.options();
        prepare(&connect, &options.schema, acquire_timeout).await?;
        if single {
            // Only to know its timeline; a read-only server is refused below.
            let _ = primary.find_at_start().await;
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(acquire_timeout)
            .after_connect({
                let primary = primary.clone();
                move |conn, _meta| {
                    let primary = primary.clone();
                    Box::pin(async move {
                        schema::session(conn, statement_timeout).await?;
                        primary.accept(conn).await
                    })
                }
            })
            // A connection opened before the writer changed is never lent
            // out again, nor kept when it comes back (src/store/postgres/primary.rs).
            .test_before_acquire(false)
            .before_acquire({
                let primary = primary.clone();
                move |conn, meta| {
                    let primary = primary.clone();
                    Box::pin(async move { primary.lend(conn, meta.age).await })
                }
            })
            .after_release({
                let primary = primary.clone();
                move |_conn, meta| {
                    let keep = !primary.fenced(meta.age);
                    Box::pin(async move { Ok(keep) })
                }
            })
            .connect_with(connect.clone())
            .await
            .map_err(|e| explain::pg_connect(&connect, &e))?;
        // The first replica to get here picks the binding; every other one reads it back.
        sqlx::query(
            "INSERT INTO store_identity (id, binding) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(rules::new_binding()?.to_vec())
        .execute(&pool)
        .await?;
        let bytes: Vec<u8> = sqlx::query_scalar("SELECT binding FROM store_identity WHERE id = 1")
            .fetch_one(&pool)
            .await?;
        let digest: [u8; 32] = bytes
            .try_into()
            .map_err(|_| StoreError::invalid_record("store binding"))?;
        let notify = Arc::new(Notify::new());
        let listener = listen::start(primary.clone(), acquire_timeout, notify.clone()).await?;
        let bound = (statement_timeout > 0)
            .then(|| Duration::from_millis(statement_timeout) + acquire_timeout * 2);
        // Set while this replica takes the others' writes: then it takes no turns.
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let keep = |backlog| {
            kept::Kept::new(
                primary.clone(),
                backlog,
                Duration::from_millis(statement_timeout),
                options.max_connections,
            )
        };
        let writes = batcher::Batcher::start(
            pool.clone(),
            write_tasks(options.max_connections),
            bound,
            notify.clone(),
            Some((
                super::turns::Queue::new(1, &options.schema),
                leading.clone(),
            )),
            keep,
        );
        let claims = batcher::Batcher::start(
            pool.clone(),
            write_tasks(options.max_connections),
            bound,
            notify.clone(),
            Some((
                super::turns::Queue::new(2, &options.schema),
                leading.clone(),
            )),
            |backlog| claim_batch::Claiming {
                turn: Turn::default(),
                kept: Arc::new(keep(backlog)),
            },
        );
        let upkeep = upkeep::start(primary.clone(), options, leading);
        // Last, once nothing can fail: the store's drop is what stops it.
        let follower = tokio::spawn(primary.clone().follow(pool.clone())).abort_handle();
        Ok(Self {
            pool,
            binding: SettlementStoreBinding::from_digest(digest),
            notify,
            listener,
            upkeep,
            primary,
            follower,
            bound,
            writes,
            claims,
        })
    }
}

/// A pool of one connection, kept until the writer changes: for a task
/// that holds its connection for good (the `LISTEN`, the upkeep) and must
/// not take one from the store's pool. Its socket gets the same timeouts as
/// the pool's; `setup` runs on it after connecting.
pub(super) fn one_kept_connection(
    primary: &Arc<primary::Primary>,
    setup: Option<&'static str>,
) -> PgPoolOptions {
    let primary = primary.clone();
    PgPoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .after_connect(move |conn, _meta| {
            primary.protect_sockets();
            Box::pin(async move {
                if let Some(sql) = setup {
                    sqlx::Executor::execute(&mut *conn, sql).await?;
                }
                Ok(())
            })
        })
}
