//! A database of its own on a PostgreSQL server, for one test or run.

use sqlx::Connection;

/// The URL of database `name` on the server of `url` (which names some
/// database, e.g. `…/postgres`, with or without `?options`).
pub fn database_url(url: &str, name: &str) -> Result<String, String> {
    let (base, options) = match url.split_once('?') {
        Some((base, options)) => (base, Some(options)),
        None => (url, None),
    };
    let (prefix, _) = base
        .rsplit_once('/')
        .filter(|(prefix, _)| prefix.contains("://") && !prefix.ends_with('/'))
        .ok_or_else(|| format!("{url} must name a database, e.g. postgres://host/postgres"))?;
    Ok(match options {
        Some(options) => format!("{prefix}/{name}?{options}"),
        None => format!("{prefix}/{name}"),
    })
}

/// A name for a test's own database, `settled_test_<unix secs>_<16 hex>`:
/// the form the integration tests' sweep of stale databases recognises.
pub fn test_database_name() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the system's random source");
    format!("settled_test_{secs}_{:016x}", u64::from_le_bytes(bytes))
}

/// Create database `name` (letters, digits and `_`) on the server of
/// `admin_url`; its URL.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String, String> {
    let url = database_url(admin_url, checked(name)?)?;
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
    let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await;
    let _ = admin.close().await;
    created.map_err(|e| format!("cannot create database {name}: {e}"))?;
    Ok(url)
}

/// Drop database `name`; `force` ends the sessions still connected to it.
pub async fn drop_database(admin_url: &str, name: &str, force: bool) -> Result<(), String> {
    let name = checked(name)?;
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
    let with = if force { " WITH (FORCE)" } else { "" };
    let dropped = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}{with}"
    )))
    .execute(&mut admin)
    .await;
    let _ = admin.close().await;
    dropped
        .map(drop)
        .map_err(|e| format!("cannot drop database {name}: {e}"))
}

/// Names are put into SQL as they are: only plain identifiers are taken.
fn checked(name: &str) -> Result<&str, String> {
    let plain = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if plain {
        Ok(name)
    } else {
        Err(format!("{name:?} is not a plain database name"))
    }
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_url_names_the_new_database_and_keeps_its_options() {
        assert_eq!(
            database_url("postgres://u@h:5432/postgres", "d").unwrap(),
            "postgres://u@h:5432/d"
        );
        assert_eq!(
            database_url("postgres://h/postgres?sslmode=disable", "d").unwrap(),
            "postgres://h/d?sslmode=disable"
        );
        assert!(database_url("postgres://h", "d").is_err());
    }
}
