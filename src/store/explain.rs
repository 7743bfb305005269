//! Start-up failures in words a person can act on: what was tried (the
//! file, the host and port, the database) and what to do about it. Never the
//! URL itself, which may hold a password.

use std::path::Path;
use std::time::Duration;

use sqlx::migrate::MigrateError;
use sqlx::postgres::PgConnectOptions;

use crate::domain::StoreError;

/// The database's own words for `error`, without sqlx's wrapping (and
/// without PostgreSQL's "at line N" of its own source code).
pub fn cause(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
                format!("{} (SQLite code {code})", db.message())
            }
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_owned(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// [`cause`] of a failed migration, naming the migration.
pub fn migrate_cause(error: &MigrateError) -> String {
    match error {
        MigrateError::Execute(e) => cause(e),
        MigrateError::ExecuteMigration(e, version) => format!("migration {version}: {}", cause(e)),
        other => other.to_string(),
    }
}

/// The SQLSTATE (or SQLite code) of a database error.
pub fn code_of(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The SQLite database at `path` could not be opened or migrated.
pub fn sqlite(path: &Path, cause: &str) -> StoreError {
    let shown = if path.is_relative() {
        match std::env::current_dir() {
            Ok(cwd) => format!("{} (in {})", path.display(), cwd.display()),
            Err(_) => path.display().to_string(),
        }
    } else {
        path.display().to_string()
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let hint = if path.is_dir() {
        format!(
            "{} is a directory: name a file in it, e.g. --database-url sqlite:{}",
            path.display(),
            path.join("settled.db").display()
        )
    } else if !dir.exists() {
        format!(
            "the directory {} does not exist: create it (mkdir -p {}) or choose another path",
            dir.display(),
            dir.display()
        )
    } else {
        format!(
            "check that the directory {} is writable by settled (SQLite creates the file and its \
             -wal and -shm files beside it), and that an existing file there is a settled database",
            dir.display()
        )
    };
    StoreError::backend(format!(
        "cannot open the SQLite database {shown}: {cause}. Hint: {hint}"
    ))
}

/// Where a PostgreSQL URL points, for messages: `HOST:PORT` or the socket.
pub fn pg_address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => format!("{} (port {})", dir.display(), options.get_port()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// The database a PostgreSQL URL names (PostgreSQL's default is the user's name).
pub fn pg_database(options: &PgConnectOptions) -> &str {
    options
        .get_database()
        .unwrap_or_else(|| options.get_username())
}

/// The first connection to PostgreSQL failed.
pub fn pg_connect(options: &PgConnectOptions, error: &sqlx::Error) -> StoreError {
    let at = pg_address(options);
    let (host, port, user) = (
        options.get_host(),
        options.get_port(),
        options.get_username(),
    );
    let database = pg_database(options);
    let message = match error {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "cannot connect to PostgreSQL: connection refused to {at}. Hint: check that \
             PostgreSQL runs and listens there (the host and port of --database-url)"
        ),
        sqlx::Error::Io(io) if io.to_string().contains("lookup") => format!(
            "cannot connect to PostgreSQL at {at}: the host name {host} does not resolve ({io}). \
             Hint: check the host of --database-url"
        ),
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => format!(
            "PostgreSQL at {at} has no database \"{database}\". Hint: create it (createdb -h {host} \
             -p {port} -U {user} {database}, or CREATE DATABASE \"{database}\"; in psql), or name \
             an existing database in --database-url"
        ),
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")) => {
            format!(
                "PostgreSQL at {at} refused role \"{user}\" on database \"{database}\": {}. Hint: \
                 check the user and password of --database-url, and the server's pg_hba.conf",
                db.message()
            )
        }
        sqlx::Error::Tls(e) => format!(
            "cannot connect to PostgreSQL at {at}: TLS failed: {e}. Hint: check sslmode in \
             --database-url and the server's certificate"
        ),
        other => format!(
            "cannot connect to PostgreSQL at {at} (database \"{database}\", role \"{user}\"): {}",
            cause(other)
        ),
    };
    StoreError::backend(message)
}

/// The first connection to PostgreSQL did not complete in time.
pub fn pg_connect_timeout(options: &PgConnectOptions, timeout: Duration) -> StoreError {
    StoreError::backend(format!(
        "cannot connect to PostgreSQL at {}: no answer within {} ms (--pg-connect-timeout-ms). \
         Hint: check the host and port of --database-url, and any firewall in between",
        pg_address(options),
        timeout.as_millis()
    ))
}

/// Creating or migrating settled's schema failed.
pub fn pg_schema(
    options: &PgConnectOptions,
    schema: &str,
    schema_existed: bool,
    cause: &str,
    code: Option<&str>,
) -> StoreError {
    let (at, user, database) = (
        pg_address(options),
        options.get_username(),
        pg_database(options),
    );
    let hint = match code {
        Some("42501") if !schema_existed => format!(
            ". Hint: role \"{user}\" may not create schemas in database \"{database}\": create it \
             once as the database's owner (CREATE SCHEMA {schema} AUTHORIZATION \"{user}\";), or \
             GRANT CREATE ON DATABASE \"{database}\" TO \"{user}\""
        ),
        Some("42501") => format!(
            ". Hint: the first start and every upgrade create tables: run them as the schema's \
             owner, or GRANT CREATE ON SCHEMA {schema} TO \"{user}\""
        ),
        _ => String::new(),
    };
    StoreError::backend(format!(
        "cannot prepare PostgreSQL schema \"{schema}\" of database \"{database}\" at {at}: \
         {cause}{hint}"
    ))
}
