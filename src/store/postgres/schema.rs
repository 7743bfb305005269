//! settled's own schema: every table, function, trigger and the migrations
//! table live in one schema (`settled` by default), so that a database
//! shared with other applications keeps its `public` schema untouched.
//! Every connection names it as its only `search_path` from the start (a
//! startup option, not a `SET`), so no statement needs to qualify a name.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection};

use super::conninfo::{self, ConnInfo};
use crate::domain::StoreError;
use crate::store::StoreResult;
use crate::store::explain;

/// The schema settled uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "settled";

/// Held while the schema is created and migrated, so that replicas starting
/// together take turns (`CREATE SCHEMA IF NOT EXISTS` alone can race).
const SETUP_LOCK: i64 = 0x7365_7474_6c65_6400; // "settled\0"

/// A schema name settled accepts: one that needs no quoting anywhere.
///
/// # Errors
/// Says which rule `name` breaks.
pub fn check_schema_name(name: &str) -> Result<(), String> {
    let rule = "a schema name is 1..=63 characters of a-z, 0-9 and _, starting with a letter or \
                _ and not with pg_ (e.g. settled)";
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !first_ok || !rest_ok || name.len() > 63 || name.starts_with("pg_") {
        return Err(format!("invalid schema name `{name}`: {rule}"));
    }
    Ok(())
}

/// Connection options for `url` (its first host) whose every session works
/// in `schema`.
///
/// # Errors
/// A backend error when `url` does not parse or `schema` is not a valid name.
pub fn connect_options(url: &str, schema: &str) -> StoreResult<PgConnectOptions> {
    let mut info = conn_info(url, schema)?;
    Ok(info.hosts.swap_remove(0).options)
}

/// Every host of `url` (libpq's forms, src/store/postgres/conninfo.rs),
/// each with options whose every session works in `schema`.
///
/// # Errors
/// A backend error naming what is wrong (never the password), or an
/// invalid schema name.
pub fn conn_info(url: &str, schema: &str) -> StoreResult<ConnInfo> {
    check_schema_name(schema).map_err(StoreError::backend)?;
    let mut info = conninfo::parse(url).map_err(|e| {
        StoreError::backend(format!(
            "invalid PostgreSQL connection string in --database-url: {e}. Hint: use \
             postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE, with several hosts as \
             HOST1:PORT1,HOST2:PORT2"
        ))
    })?;
    for host in &mut info.hosts {
        let mut options = host.options.clone().options([("search_path", schema)]);
        // Named "settled" unless the connection string names it.
        if options.get_application_name().is_none() {
            options = options.application_name("settled");
        }
        host.options = options;
    }
    Ok(info)
}

/// Settings of every session settled opens.
pub(super) async fn session(
    conn: &mut PgConnection,
    statement_timeout_ms: u64,
) -> sqlx::Result<()> {
    let set = format!("SET statement_timeout = {statement_timeout_ms}");
    conn.execute(sqlx::AssertSqlSafe(set)).await?;
    // A transaction whose client went silent (a network partition, a
    // frozen host) would keep its row locks, and so hide its receipts from
    // every replica's claims, until the server noticed the dead peer: hours
    // with default TCP keepalives. The server ends it after the same bound.
    let set = format!("SET idle_in_transaction_session_timeout = {statement_timeout_ms}");
    conn.execute(sqlx::AssertSqlSafe(set)).await?;
    // Every statement settled runs reads index ranges and takes milliseconds;
    // a generic plan's estimate can still pass `jit_above_cost`, and then
    // compiling it costs far more than running it (docs/perf-log/groups-and-status.md).
    conn.execute("SET jit = off").await?;
    Ok(())
}

/// Connect once (so that an unreachable server or a missing database is
/// reported at once, in words, rather than as a pool timeout), then create
/// `schema` if missing and apply the migrations it lacks, logging both.
///
/// # Errors
/// A backend error whose message names the host, port, database or schema
/// and says what to do.
pub async fn prepare(
    options: &PgConnectOptions,
    schema: &str,
    connect_timeout: Duration,
) -> StoreResult<()> {
    let mut conn =
        match tokio::time::timeout(connect_timeout, PgConnection::connect_with(options)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(explain::pg_connect(options, &e)),
            Err(_) => return Err(explain::pg_connect_timeout(options, connect_timeout)),
        };
    let existed = schema_exists(&mut conn, schema).await.unwrap_or(false);
    // Migrations run without the statement time limit the service's own
    // statements have: building an index on a large table (or any DDL on a
    // loaded server) may take longer, and a start-up that cancels its own
    // migration would never succeed. The advisory lock keeps it to one replica.
    let result = async {
        session(&mut conn, 0).await?;
        migrate(&mut conn, options, schema).await
    }
    .await;
    // Closing also ends the session's advisory lock.
    let _ = conn.close().await;
    result.map_err(|e| match e {
        Setup::Refused(error) => error,
        Setup::Sql(e) => explain::pg_schema(
            options,
            schema,
            existed,
            &explain::cause(&e),
            explain::code_of(&e).as_deref(),
        ),
        Setup::Migrate(e) => {
            let code = match &e {
                sqlx::migrate::MigrateError::Execute(inner)
                | sqlx::migrate::MigrateError::ExecuteMigration(inner, _) => {
                    explain::code_of(inner)
                }
                _ => None,
            };
            explain::pg_schema(
                options,
                schema,
                existed,
                &format!("migration failed: {}", explain::migrate_cause(&e)),
                code.as_deref(),
            )
        }
    })
}

enum Setup {
    Sql(sqlx::Error),
    Migrate(sqlx::migrate::MigrateError),
    Refused(StoreError),
}

impl From<sqlx::Error> for Setup {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

async fn schema_exists(conn: &mut PgConnection, schema: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(conn)
        .await
}

/// Versions applied in the session's schema (none when it has no
/// migrations table yet).
async fn applied(conn: &mut PgConnection) -> sqlx::Result<Option<Vec<(i64, Vec<u8>)>>> {
    let present: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(&mut *conn)
            .await?;
    if present.is_none() {
        return Ok(None);
    }
    let rows = sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
        .fetch_all(conn)
        .await?;
    Ok(Some(rows))
}

async fn migrate(
    conn: &mut PgConnection,
    options: &PgConnectOptions,
    schema: &str,
) -> Result<(), Setup> {
    let migrator = sqlx::migrate!("migrations/postgres");
    let up_to_date = |done: &Option<Vec<(i64, Vec<u8>)>>| {
        done.as_ref().is_some_and(|done| {
            migrator.iter().all(|m| {
                done.iter()
                    .any(|(v, sum)| *v == m.version && sum.as_slice() == &*m.checksum)
            })
        })
    };
    // Nothing to create: a role limited to reading and writing rows can run
    // the service, so take no lock and create nothing.
    if up_to_date(&applied(conn).await?) {
        log_using(options, schema);
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SETUP_LOCK)
        .execute(&mut *conn)
        .await?;
    let before = applied(conn).await?;
    if before.is_none() {
        refuse_if_tables_in_public(conn, options, schema).await?;
    }
    if !schema_exists(conn, schema).await? {
        let create = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
        conn.execute(sqlx::AssertSqlSafe(create)).await?;
        tracing::info!(
            schema,
            database = explain::pg_database(options),
            "created PostgreSQL schema {schema} in database {}",
            explain::pg_database(options)
        );
    }
    let before = before.unwrap_or_default();
    migrator.run(&mut *conn).await.map_err(Setup::Migrate)?;
    let now_applied: Vec<String> = migrator
        .iter()
        .filter(|m| !before.iter().any(|(v, _)| *v == m.version))
        .map(|m| format!("{:04} {}", m.version, m.description))
        .collect();
    if !now_applied.is_empty() {
        tracing::info!(
            schema,
            migrations = ?now_applied,
            "applied migrations {} in PostgreSQL schema {schema}",
            now_applied.join(", ")
        );
    }
    log_using(options, schema);
    Ok(())
}

fn log_using(options: &PgConnectOptions, schema: &str) {
    tracing::info!(
        schema,
        database = explain::pg_database(options),
        server = %explain::pg_address(options),
        "using PostgreSQL schema {schema} of database {} at {}",
        explain::pg_database(options),
        explain::pg_address(options)
    );
}

/// Versions before the schema of its own kept everything in `public`.
/// Starting afresh in a new schema would silently leave every receipt
/// behind, so say where they are and how to keep them.
async fn refuse_if_tables_in_public(
    conn: &mut PgConnection,
    options: &PgConnectOptions,
    schema: &str,
) -> Result<(), Setup> {
    if schema == "public" {
        return Ok(());
    }
    let earlier: bool = sqlx::query_scalar(
        "SELECT to_regclass('public._sqlx_migrations') IS NOT NULL \
         AND to_regclass('public.store_identity') IS NOT NULL",
    )
    .fetch_one(conn)
    .await?;
    if !earlier {
        return Ok(());
    }
    Err(Setup::Refused(StoreError::backend(format!(
        "database \"{}\" at {} holds settled's tables in schema public (made by an earlier \
         version), and schema {schema} has none. Hint: to keep using them, start with \
         --pg-schema public (SETTLED_PG_SCHEMA=public); or stop every replica and move them \
         (docs/deployment.md, \"Upgrading to a schema of its own\")",
        explain::pg_database(options),
        explain::pg_address(options)
    ))))
}

/// The second key of a schema's advisory locks (upkeep, turns): a hash of its
/// name (FNV-1a), kept positive so that `pg_locks` shows it as it was given.
pub(super) fn lock_key(schema: &str) -> i32 {
    let hash = schema.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    i32::try_from(hash & 0x7fff_ffff).unwrap_or_default()
}
