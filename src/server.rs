//! Start-up, connections and graceful shutdown.

mod accepted;
mod clock_sync;
mod connections;

use accepted::{AcceptFailures, Shared};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServeArgs;
use crate::http::middleware::auth::Tokens;
use crate::http::middleware::origin::AllowedHosts;
use crate::http::{AppState, REQUEST_TIMEOUT, app};
use crate::store::{OpenError, open_store};

/// Why the service did not start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("invalid retry policy: {0}")]
    Policy(#[from] crate::domain::RetryPolicyError),
    /// Says what was tried (the path, the host and port) and what to do.
    #[error("{0}")]
    Store(String),
    /// The OTLP trace exporter cannot be built from the `OTEL_*` variables.
    #[error("{0}")]
    Telemetry(String),
    #[error("cannot listen on {addr}: {source}{}", listen_hint(.source))]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "refusing to listen on {0}: without tokens settled is anonymous and only listens on loopback. \
         Configure bearer tokens with --token ROLE:TOKEN (repeatable) or \
         SETTLED_TOKENS=ROLE:TOKEN,ROLE:TOKEN (roles: producer, worker, reader, operator)"
    )]
    AnonymousNonLoopback(std::net::SocketAddr),
    #[error("{0}")]
    Limits(String),
    #[error("invalid --allowed-host: {0}")]
    AllowedHost(String),
    #[error(
        "--advertise-url {0} names a host this replica does not answer without tokens: \
         advertise a loopback address, or configure tokens (--token ROLE:TOKEN)"
    )]
    AdvertiseUrl(String),
    #[error("invalid token: {0}")]
    Token(#[from] crate::http::middleware::auth::TokenError),
    #[error("server failed: {0}")]
    Serve(std::io::Error),
}

/// What to do about a failed bind, for the usual causes.
fn listen_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            ". Another process listens on this port: stop it, or choose another port \
             (--listen 127.0.0.1:8081, or --listen :0 for any free one)"
        }
        std::io::ErrorKind::PermissionDenied => {
            ". Ports below 1024 need privileges: choose a port from 1024 up (--listen :8080)"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            ". This machine has no such address: use 127.0.0.1, or one of its own addresses"
        }
        _ => "",
    }
}

/// Longest a client may take to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Check the configuration, open the store, bind, and serve until `stop` resolves.
pub async fn run(
    args: &ServeArgs,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let policy = args.retry_policy()?;
    let tokens = Tokens::parse(&args.tokens)?;
    if tokens.is_empty() && !args.listen.ip().is_loopback() {
        return Err(StartError::AnonymousNonLoopback(args.listen));
    }
    let hosts = AllowedHosts::loopback_and(&args.allowed_hosts).map_err(StartError::AllowedHost)?;
    // Without tokens a replica answers its allowed host names only, so the
    // others' forwarded requests would be refused.
    if let Some(url) = &args.advertise_url {
        let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        if tokens.is_empty() && !hosts.allows(authority) {
            return Err(StartError::AdvertiseUrl(url.clone()));
        }
    }
    let streams = args.stream_limits().map_err(StartError::Limits)?;
    // Bind before the database is created or migrated: a port in use must
    // not leave a new database behind.
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: args.listen,
            source,
        })?;
    let store = open_store(&args.database_url, &args.postgres())
        .await
        .map_err(|e| {
            StartError::Store(match e {
                // Start-up failures are written for the person starting it.
                OpenError::Scheme(detail)
                | OpenError::Store(crate::domain::StoreError::Backend { detail, .. }) => detail,
                other => format!("cannot open the database: {other}"),
            })
        })?;
    let local = listener.local_addr().map_err(StartError::Serve)?;
    tracing::info!(address = %local, backend = store.backend().as_str(), "settled listening on http://{local}");
    let (tx, rx) = watch::channel(false);
    let clock = clock_sync::start(store.clone(), rx.clone()).await;
    if let Some(retain) = args.retain_finished {
        tokio::spawn(crate::retention::run(
            store.clone(),
            clock.clone(),
            retain,
            rx.clone(),
        ));
    }
    if !args.forget_idle_groups.is_zero() {
        tokio::spawn(crate::group_sweep::run(
            store.clone(),
            args.forget_idle_groups,
            rx.clone(),
        ));
    }
    let mut state = AppState::new(store, policy, clock, rx)
        .with_tokens(tokens)
        .with_allowed_hosts(hosts)
        .with_stream_limits(streams);
    let (dropped, exported) = state.trace_counters();
    let telemetry =
        crate::telemetry::Telemetry::from_env(dropped, exported).map_err(StartError::Telemetry)?;
    if let Some(telemetry) = telemetry.clone() {
        tracing::info!("exporting traces over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)");
        state = state.with_telemetry(telemetry);
    }
    let stop = async move {
        stop.await;
        tracing::info!("shutting down: finishing requests in flight");
        let _ = tx.send(true);
    };
    let limits = Limits {
        idle_timeout: args.idle_timeout,
        max_connections: args.max_connections,
        ..Limits::default()
    };
    let served = serve_with(listener, state, stop, limits).await;
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    served.map_err(StartError::Serve)
}

/// How long shutdown waits for open connections once `stop` has resolved.
/// Longer than any request may take ([`REQUEST_TIMEOUT`]), so every request
/// in flight is answered; a client that never finishes sending its request
/// head cannot keep the process alive forever.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(REQUEST_TIMEOUT.as_secs() + 5);

/// Most requests (streams) open at once on one HTTP/2 connection.
pub const H2_MAX_STREAMS: u32 = 64;
/// How often an HTTP/2 connection is pinged, and how long the answer may take.
const H2_PING_EVERY: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of `--idle-timeout`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::config::MAX_CONNECTIONS;

/// Longest pause of the accept loop after `accept` fails (out of file
/// descriptors and the like).
const ACCEPT_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// What the server allows each connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A connection on which no request has run for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections open at once; see [`serve_with`] for what happens at the cap.
    pub max_connections: usize,
    /// How long shutdown waits for connections still open.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            grace: SHUTDOWN_GRACE,
        }
    }
}

/// Serve `state` on `listener` until `stop` resolves, then finish requests in flight.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, stop, Limits::default()).await
}

/// [`serve`], giving connections still open `grace` after `stop` resolved
/// before returning anyway (the connections left are dropped with the runtime).
pub async fn serve_with_grace(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let limits = Limits {
        grace,
        ..Limits::default()
    };
    serve_with(listener, state, stop, limits).await
}

/// [`serve`] with explicit [`Limits`].
///
/// hyper is driven directly (not through `axum::serve`) so that the server
/// decides when a connection ends: a client that sends half a request head
/// is cut off after [`HEADER_READ_TIMEOUT`]; a connection on which no request
/// runs for `idle_timeout` (one that never sends anything, an idle keep-alive
/// or HTTP/2 connection) is closed; and at `max_connections` a new connection
/// makes room by closing the connection idle longest, or, when every
/// connection has a request running, is closed at once. When `accept` fails
/// (out of file descriptors) the longest idle connection is closed too and
/// the loop backs off instead of spinning.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioTimer;
    use hyper_util::server::conn::auto::Builder;

    let mut builder = Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    // One HTTP/2 connection may not hold more requests open than this; a
    // peer that stops answering pings is dropped with all of its streams.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(Some(H2_PING_EVERY))
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let stats = state.clone();
    let server = Arc::new(Shared {
        router: app(state),
        builder,
        registry: connections::Registry::new(),
        limits,
        stopping: watch::channel(false).0,
    });
    let flusher = tokio::spawn(crate::http::rate_counts::flush_every(
        stats.clone(),
        stats.stats_every(),
        server.stopping.subscribe(),
    ));
    let mut backoff = Duration::ZERO;
    let mut failures = AcceptFailures::default();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                server.serve(stream);
            }
            Err(e) => {
                // Out of file descriptors and the like: free one if an idle
                // connection holds it, and wait longer each time, not spin.
                server.registry.close_longest_idle();
                backoff = (backoff * 2).clamp(Duration::from_millis(10), ACCEPT_BACKOFF_CAP);
                failures.record(&e);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut stop => break,
                }
            }
        }
    }
    // Connections the kernel completed before the listener closes are
    // clients that already sent (or are sending) a request: serve them too,
    // rather than resetting them with the listener.
    let listener = listener.into_std()?;
    while let Ok((stream, _)) = listener.accept() {
        if stream.set_nonblocking(true).is_ok()
            && let Ok(stream) = tokio::net::TcpStream::from_std(stream)
        {
            server.serve(stream);
        }
    }
    drop(listener);
    let _ = server.stopping.send(true);
    let grace = server.limits.grace;
    let deadline = tokio::time::Instant::now() + grace;
    while !server.registry.is_empty() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                open = server.registry.len(),
                "connections still open after the shutdown grace period \
                 (clients that never finished a request); exiting"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The rates counted since the last flush, the last requests' included
    // (docs/operators.md, "Rates over the last hour"); a failure is logged.
    let _ = flusher.await;
    let _ = stats.flush_stats().await;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: the server listens before
/// it migrates and serves, and a SIGTERM in between must stop it gracefully
/// instead of killing it.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(interrupt) => {}
                () = wait(terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
