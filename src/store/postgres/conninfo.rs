//! libpq's connection strings: the URL form with a host list
//! (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`),
//! `host=`/`port=`/`hostaddr=` lists in its query, and the keyword/value form
//! (`host=h1,h2 port=5432 dbname=db`). sqlx takes one host and logs, then
//! ignores, a parameter it does not know; settled needs a host list to follow
//! the primary, and refuses a parameter it would not honour rather than run
//! without it (docs/high-availability.md). A query's `+` is read as a space,
//! as sqlx read it before (libpq keeps it).

use std::time::Duration;

use percent_encoding::percent_decode_str;
use sqlx::postgres::PgConnectOptions;

use super::keepalive::TcpTimeouts;

mod build;

/// One host of the list: as written, and its own connect options.
#[derive(Debug, Clone)]
pub struct Host {
    /// `host:port` as the connection string names it (no user or password).
    pub label: String,
    pub options: PgConnectOptions,
    /// Its `hostaddr`, where given: the address connected to.
    pub address: Option<std::net::SocketAddr>,
}

/// A parsed connection string.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Tried in this order for a server that accepts writes.
    pub hosts: Vec<Host>,
    /// libpq's `connect_timeout`: the longest wait for one host.
    pub connect_timeout: Option<Duration>,
    /// The `keepalives*` and `tcp_user_timeout` parameters, each `None`
    /// when not given or 0 (the server's flag decides).
    pub keepalives: Option<bool>,
    pub keepalives_idle: Option<Duration>,
    pub keepalives_interval: Option<Duration>,
    pub keepalives_count: Option<u32>,
    pub tcp_user_timeout: Option<Duration>,
}

impl ConnInfo {
    /// The socket settings: `defaults` (from `--pg-tcp-timeout-ms`), with
    /// each parameter the connection string gives in its place.
    #[must_use]
    pub fn tcp_timeouts(&self, defaults: TcpTimeouts) -> TcpTimeouts {
        let keepalive = match (self.keepalives, defaults.keepalive) {
            (Some(false), _) => None,
            (_, Some((idle, interval, count))) => Some((
                self.keepalives_idle.unwrap_or(idle),
                self.keepalives_interval.unwrap_or(interval),
                self.keepalives_count.unwrap_or(count),
            )),
            (Some(true), None) => Some((
                self.keepalives_idle.unwrap_or(Duration::from_secs(5)),
                self.keepalives_interval.unwrap_or(Duration::from_secs(1)),
                self.keepalives_count.unwrap_or(5),
            )),
            (None, None) => None,
        };
        let user_timeout = match self.tcp_user_timeout {
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
            None => defaults.user_timeout,
        };
        TcpTimeouts {
            keepalive,
            user_timeout,
        }
    }
}

/// Parameters sqlx applies itself, passed on to it unchanged.
const PASSED: &[&str] = &[
    "hostaddr",
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "application_name",
    "options",
];

/// libpq parameters whose value asks for nothing sqlx does not do already:
/// accepted with these values, refused with any other.
const ALREADY: &[(&str, &[&str])] = &[
    ("gssencmode", &["disable", "prefer"]),
    ("channel_binding", &["disable", "prefer"]),
    ("load_balance_hosts", &["disable"]),
    ("client_encoding", &["UTF8", "utf8", "UTF-8", "utf-8"]),
    ("sslnegotiation", &["postgres"]),
];

/// Parse `text` (a `postgres://` or `postgresql://` URL, or libpq's
/// keyword/value form).
///
/// # Errors
/// A message naming what is wrong; never the password.
pub fn parse(text: &str) -> Result<ConnInfo, String> {
    let parts = if let Some(rest) = text
        .strip_prefix("postgres://")
        .or_else(|| text.strip_prefix("postgresql://"))
    {
        url_parts(rest)?
    } else {
        keyword_parts(text)?
    };
    parts.build()
}

/// Whether `text` looks like libpq's keyword/value form.
#[must_use]
pub fn is_keyword_form(text: &str) -> bool {
    !text.contains("://")
        && text
            .split_whitespace()
            .next()
            .and_then(|word| word.split_once('='))
            .is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
}

/// What a connection string says, before it is checked.
#[derive(Debug, Default)]
struct Parts {
    /// `(host, port)` as written; the port may be empty.
    hosts: Vec<(String, String)>,
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
    /// Every other parameter, in order.
    params: Vec<(String, String)>,
}

fn decode(text: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "the connection string is not valid UTF-8 once decoded".to_owned())
}

fn url_parts(rest: &str) -> Result<Parts, String> {
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    let mut parts = Parts::default();
    let hostlist = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                parts.user = Some(decode(user)?);
            }
            parts.password = password.map(decode).transpose()?;
            hosts
        }
        None => authority,
    };
    if !hostlist.is_empty() {
        for spec in hostlist.split(',') {
            parts.hosts.push(split_host_port(spec)?);
        }
    }
    if !path.is_empty() {
        parts.dbname = Some(decode(path)?);
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // A query is form-encoded: `+` is a space.
        let key = decode(&key.replace('+', " "))?;
        let value = decode(&value.replace('+', " "))?;
        parts.params.push((key, value));
    }
    Ok(parts)
}

/// `host[:port]`, `[v6]` or `[v6]:port`.
fn split_host_port(spec: &str) -> Result<(String, String), String> {
    if let Some(v6) = spec.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| "an unclosed `[` in the host list".to_owned())?;
        let port = after.strip_prefix(':').unwrap_or(after);
        return Ok((format!("[{host}]"), port.to_owned()));
    }
    let (host, port) = spec.split_once(':').unwrap_or((spec, ""));
    Ok((decode(host)?, port.to_owned()))
}

/// libpq's `keyword=value` pairs, separated by spaces; a value may be
/// single-quoted, with `\'` and `\\` inside.
fn keyword_parts(text: &str) -> Result<Parts, String> {
    let mut params = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(
                "a keyword has no value in the connection string (expected keyword=value)"
                    .to_owned(),
            );
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err("an unterminated quote in the connection string".to_owned()),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        params.push((key, value));
    }
    Ok(Parts {
        params,
        ..Parts::default()
    })
}

/// Whole seconds; 0 means "not set", as in libpq.
fn seconds(key: &str, value: &str) -> Result<Option<Duration>, String> {
    value
        .trim()
        .parse::<u64>()
        .map(|s| (s > 0).then(|| Duration::from_secs(s)))
        .map_err(|_| format!("`{key}` must be a whole number of seconds, not `{value}`"))
}

#[cfg(test)]
#[path = "conninfo_tests.rs"]
mod tests;
