//! Command line and environment configuration.

use std::net::SocketAddr;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::domain::{RetryPolicy, RetryPolicyError};
use crate::store::postgres::PostgresOptions;

/// What `--help` adds after the options: where to look once it runs.
const AFTER_HELP: &str = "\
Logs go to standard output; RUST_LOG filters them (default `info`, e.g.
RUST_LOG=settled=debug,info).

Once running (by default on http://127.0.0.1:8080):
  /                 the operator dashboard
  /docs             interactive API documentation (the contract: /openapi.yaml,
                    or `settled openapi`)
  /healthz /readyz  liveness and readiness; /metrics for Prometheus

Documentation: README.md and docs/ in the source repository.";

/// settled: settles payment receipts reliably over HTTP/JSON.
#[derive(Debug, Parser)]
#[command(
    name = "settled",
    version,
    about,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of `serve`, also accepted with no sub-command.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Sub-commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (the default).
    #[command(after_help = AFTER_HELP)]
    // Boxed: the options dwarf the other variant.
    Serve(Box<ServeArgs>),
    /// Print the OpenAPI document (YAML) and exit.
    Openapi,
    /// Ask a running server whether it is ready (`GET /readyz`): exit 0 when it answers 2xx,
    /// 1 otherwise with the reason on one line. For container health checks.
    Healthcheck(HealthcheckArgs),
}

/// Options of `healthcheck`.
#[derive(Debug, Clone, Args)]
pub struct HealthcheckArgs {
    /// The address `serve` listens on: the same flag and variable, so a container's settings
    /// serve both. `0.0.0.0` and `[::]` are asked on loopback.
    #[arg(long, env = "SETTLED_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Ask this URL instead, e.g. `http://127.0.0.1:8080/readyz` (plain HTTP: settled serves no
    /// TLS). Wins over --listen and SETTLED_LISTEN.
    #[arg(long, conflicts_with = "live")]
    pub url: Option<String>,
    /// Ask `/healthz` (the process answers) instead of `/readyz` (it answers and its database
    /// takes writes).
    #[arg(long)]
    pub live: bool,
    /// Give up after this long (connecting, sending and reading the answer), e.g. `2s`.
    #[arg(long, default_value = "5s", value_parser = parse_check_timeout)]
    pub timeout: std::time::Duration,
}

/// A health check's time limit: 100 ms ..= 5 min.
fn parse_check_timeout(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration < std::time::Duration::from_millis(100)
        || duration > std::time::Duration::from_secs(300)
    {
        return Err("the timeout must be 100ms..=5min".to_owned());
    }
    Ok(duration)
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Default of `--max-connections`: with the usual soft limit of 1024 open
/// files this leaves room for the database, logs and a margin.
pub const MAX_CONNECTIONS: usize = 512;

/// Options of the HTTP service.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on: IP:PORT, localhost:PORT, or a port alone (`8080`, `:8080`) on
    /// 127.0.0.1. Without tokens only loopback addresses are accepted.
    #[arg(long, env = "SETTLED_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// `sqlite:PATH` (created if missing) or `postgres://USER@HOST/DB`.
    #[arg(
        long,
        env = "SETTLED_DATABASE_URL",
        default_value = "sqlite:settled.db",
        hide_env_values = true
    )]
    pub database_url: String,
    /// Retries before a retryable failure is dead-lettered (0..=32).
    #[arg(long, env = "SETTLED_MAX_RETRIES", default_value_t = RetryPolicy::default().max_retries())]
    pub max_retries: u32,
    /// Wait before the first retry, in ms (1..=backoff cap).
    #[arg(long, env = "SETTLED_INITIAL_BACKOFF_MS", default_value_t = RetryPolicy::default().initial_backoff_ms())]
    pub initial_backoff_ms: u64,
    /// Growth factor of the wait per retry (1..=16).
    #[arg(long, env = "SETTLED_BACKOFF_MULTIPLIER", default_value_t = RetryPolicy::default().backoff_multiplier())]
    pub backoff_multiplier: u32,
    /// Longest wait between retries, in ms (1..=86400000).
    #[arg(long, env = "SETTLED_BACKOFF_CAP_MS", default_value_t = RetryPolicy::default().backoff_cap_ms())]
    pub backoff_cap_ms: u64,
    /// Bearer token as ROLE:TOKEN or ROLE:NAME:TOKEN (roles: producer, worker, operator, reader;
    /// the name, 1..=64 of `A-Za-z0-9._-`, is recorded in history and the request log); repeatable.
    #[arg(
        long = "token",
        env = "SETTLED_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub tokens: Vec<String>,
    /// PostgreSQL: most connections in the pool.
    #[arg(long, env = "SETTLED_PG_MAX_CONNECTIONS", default_value_t = PostgresOptions::default().max_connections)]
    pub pg_max_connections: u32,
    /// PostgreSQL: longest wait for a connection, in ms.
    #[arg(long, env = "SETTLED_PG_CONNECT_TIMEOUT_MS", default_value_t = PostgresOptions::default().connect_timeout_ms)]
    pub pg_connect_timeout_ms: u64,
    /// PostgreSQL: longest time one statement may run, in ms.
    #[arg(long, env = "SETTLED_PG_STATEMENT_TIMEOUT_MS", default_value_t = PostgresOptions::default().statement_timeout_ms)]
    pub pg_statement_timeout_ms: u64,
    /// PostgreSQL: the schema that holds settled's tables (created if missing); 1..=63 of
    /// a-z, 0-9 and _, not starting with a digit or `pg_`.
    #[arg(long, env = "SETTLED_PG_SCHEMA", default_value_t = PostgresOptions::default().schema,
        value_parser = parse_schema)]
    pub pg_schema: String,
    /// PostgreSQL: vacuum the receipts table once this many of its row versions are dead (and
    /// at least a tenth of its live rows), one replica at a time; 0 leaves it to autovacuum.
    #[arg(long, env = "SETTLED_PG_VACUUM_DEAD_ROWS", default_value_t = PostgresOptions::default().vacuum_dead_rows)]
    pub pg_vacuum_dead_rows: u64,
    /// PostgreSQL: give up on a server that stops answering without a reset (a host powered off,
    /// a network partition) after about this long, in ms: TCP keepalives on idle connections and
    /// TCP_USER_TIMEOUT on busy ones, then look for the writable host again. 0 leaves the system's
    /// defaults (hours). The connection string's keepalives* and tcp_user_timeout win.
    #[arg(long, env = "SETTLED_PG_TCP_TIMEOUT_MS", default_value_t = PostgresOptions::default().tcp_timeout_ms)]
    pub pg_tcp_timeout_ms: u64,
    /// PostgreSQL: the URL at which the other replicas of the database reach this one on their
    /// private network, such as `http://10.0.0.5:8080` (http, a host and a port). The replica doing the upkeep then takes the others' claims and
    /// outcomes and runs them as few statements and commits; each replica sends its own there
    /// while it can reach it, and serves them itself while it cannot. Set it on every replica.
    #[arg(long, env = "SETTLED_ADVERTISE_URL", value_parser = parse_advertise_url)]
    pub advertise_url: Option<String>,
    /// Remove settled and skipped receipts (and their history) this long after they finished,
    /// e.g. `30d` or `12h`. Dead letters are kept until redriven. Off when absent. A removed
    /// receipt is forgotten: enqueueing its id again creates a new receipt, so keep this
    /// longer than any producer may retry an enqueue.
    #[arg(long, env = "SETTLED_RETAIN_FINISHED", value_parser = humantime::parse_duration)]
    pub retain_finished: Option<std::time::Duration>,
    /// Forget idle groups: every this long, the replica doing the upkeep passes over the group
    /// rows and deletes those with no limits set and no active receipt (a receipt naming the
    /// group again brings it back), e.g. `1h`; `0s` keeps every group.
    #[arg(long, env = "SETTLED_FORGET_IDLE_GROUPS", value_parser = humantime::parse_duration, default_value = "1h")]
    pub forget_idle_groups: std::time::Duration,
    /// Log line format.
    #[arg(long, env = "SETTLED_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Close a connection on which no request has run for this long (a client that connects and
    /// sends nothing, an idle keep-alive or HTTP/2 connection), e.g. `60s`.
    #[arg(long, env = "SETTLED_IDLE_TIMEOUT", value_parser = parse_idle_timeout, default_value = "60s")]
    pub idle_timeout: std::time::Duration,
    /// Most connections open at once (1..=1000000). At the cap a new connection closes the one
    /// idle longest; when every connection has a request running it is closed at once. Keep the
    /// open-files limit (`ulimit -n`) above this plus 64.
    #[arg(long, env = "SETTLED_MAX_CONNECTIONS", default_value_t = MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000).map(|n| n as usize))]
    pub max_connections: usize,
    /// Most history event streams (`GET /v1/history` as `text/event-stream`) open at once,
    /// 0..=100000 and below --max-connections (0: streams refused; readers page instead).
    /// Default: 64, or a quarter of --max-connections when that is less. A stream past it is
    /// answered 429 `too_many_streams` with Retry-After.
    #[arg(long, env = "SETTLED_MAX_STREAMS",
        value_parser = clap::value_parser!(u32).range(0..=100_000).map(|n| n as usize))]
    pub max_streams: Option<usize>,
    /// Most history event streams one token may hold open (1..=100000; without tokens every
    /// caller is one caller).
    #[arg(long, env = "SETTLED_MAX_STREAMS_PER_CALLER", default_value_t = crate::http::middleware::stream_cap::MAX_STREAMS_PER_CALLER,
        value_parser = clap::value_parser!(u32).range(1..=100_000).map(|n| n as usize))]
    pub max_streams_per_caller: usize,
    /// Without tokens, a host name (besides localhost and loopback addresses) that requests
    /// may name in `Host`, e.g. `settled.internal`; repeatable.
    #[arg(
        long = "allowed-host",
        env = "SETTLED_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
}

/// A `--listen` address. Besides `IP:PORT`, what people type for "this
/// machine, port N": `localhost:N`, `:N` and `N`, all on 127.0.0.1 (never
/// every interface: that takes an explicit `0.0.0.0:N` and tokens).
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
    let text = text.trim();
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    if let Ok(port) = text.strip_prefix(':').unwrap_or(text).parse::<u16>() {
        return Ok(SocketAddr::from((LOOPBACK, port)));
    }
    if let Some((host, port)) = text.rsplit_once(':')
        && host.eq_ignore_ascii_case("localhost")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::from((LOOPBACK, port)));
    }
    let missing_port = if text.parse::<std::net::IpAddr>().is_ok() || text == "localhost" {
        "a port is missing. "
    } else {
        ""
    };
    Err(format!(
        "{missing_port}Give IP:PORT, localhost:PORT or a port alone, e.g. 127.0.0.1:8080, \
         localhost:8080, :8080 or 8080 (these four listen on 127.0.0.1), [::1]:8080, or \
         0.0.0.0:8080 for every interface (needs --token); port 0 picks a free port"
    ))
}

/// A `--pg-schema` name.
fn parse_schema(text: &str) -> Result<String, String> {
    crate::store::postgres::check_schema_name(text).map(|()| text.to_owned())
}

/// An advertised URL: `http`, a host, no path, query or credentials; kept
/// without a trailing slash, as request paths are added. Not `https`: the
/// replicas forward to each other without TLS, on their private network.
fn parse_advertise_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
    let plain = url.scheme() == "http"
        && url.has_host()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    if !plain || text.len() > 2048 {
        return Err("an advertised URL is http://, a host and a port, no path".into());
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// An idle timeout: a duration of 1 s ..= 1 h.
fn parse_idle_timeout(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration < std::time::Duration::from_secs(1)
        || duration > std::time::Duration::from_secs(3600)
    {
        return Err("the idle timeout must be 1s..=1h".to_owned());
    }
    Ok(duration)
}

impl ServeArgs {
    /// The retry policy as given, checked.
    pub const fn retry_policy(&self) -> Result<RetryPolicy, RetryPolicyError> {
        RetryPolicy::new(
            self.max_retries,
            self.initial_backoff_ms,
            self.backoff_multiplier,
            self.backoff_cap_ms,
        )
    }

    /// The caps on event streams; refused when they would leave no room for
    /// ordinary requests.
    pub fn stream_limits(&self) -> Result<crate::http::StreamLimits, String> {
        let total = match self.max_streams {
            Some(n) if n >= self.max_connections => {
                return Err(format!(
                    "--max-streams ({n}) must be below --max-connections ({}), so that workers, \
                     producers and health checks always find a connection",
                    self.max_connections
                ));
            }
            Some(n) => n,
            None => crate::http::middleware::stream_cap::MAX_STREAMS.min(self.max_connections / 4),
        };
        Ok(crate::http::StreamLimits {
            total,
            per_caller: self.max_streams_per_caller,
        })
    }

    /// PostgreSQL pool settings and schema.
    #[must_use]
    pub fn postgres(&self) -> PostgresOptions {
        PostgresOptions {
            max_connections: self.pg_max_connections,
            connect_timeout_ms: self.pg_connect_timeout_ms,
            statement_timeout_ms: self.pg_statement_timeout_ms,
            schema: self.pg_schema.clone(),
            vacuum_dead_rows: self.pg_vacuum_dead_rows,
            tcp_timeout_ms: self.pg_tcp_timeout_ms,
            advertise_url: self.advertise_url.clone(),
        }
    }
}
