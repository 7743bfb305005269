//! Start-up and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::clock::SystemClock;
use crate::config::ServeArgs;
use crate::http::auth::Tokens;
use crate::http::{AppState, REQUEST_TIMEOUT, app};
use crate::store::open_store;

/// Why the service did not start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("invalid retry policy: {0}")]
    Policy(#[from] crate::domain::RetryPolicyError),
    #[error("cannot open the database: {0}")]
    Store(#[from] crate::domain::SettlementRouteError),
    #[error("cannot listen on {addr}: {source}")]
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
    #[error("invalid token: {0}")]
    Token(#[from] crate::http::auth::TokenError),
    #[error("server failed: {0}")]
    Serve(std::io::Error),
}

/// Longest a client may take to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Check the configuration, open the store, bind, and serve until `stop` resolves.
pub async fn run(
    args: &ServeArgs,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let policy = args.retry_policy();
    policy.validate()?;
    let tokens = Tokens::parse(&args.tokens)?;
    if tokens.is_empty() && !args.listen.ip().is_loopback() {
        return Err(StartError::AnonymousNonLoopback(args.listen));
    }
    let store = open_store(&args.database_url, &args.postgres()).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: args.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(StartError::Serve)?;
    tracing::info!(address = %local, backend = store.backend().as_str(), "settled listening on http://{local}");
    let (tx, rx) = watch::channel(false);
    if let Some(retain) = args.retain_finished {
        tokio::spawn(crate::retention::run(
            store.clone(),
            Arc::new(SystemClock),
            retain,
            rx.clone(),
        ));
    }
    let state = AppState::new(store, policy, Arc::new(SystemClock), rx).with_tokens(tokens);
    serve(listener, state, async move {
        stop.await;
        tracing::info!("shutting down: finishing requests in flight");
        let _ = tx.send(true);
    })
    .await
    .map_err(StartError::Serve)
}

/// How long shutdown waits for open connections once `stop` has resolved.
/// Longer than any request may take ([`REQUEST_TIMEOUT`]), so every request
/// in flight is answered; a client that never finishes sending its request
/// head cannot keep the process alive forever.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(REQUEST_TIMEOUT.as_secs() + 5);

/// Serve `state` on `listener` until `stop` resolves, then finish requests in flight.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_grace(listener, state, stop, SHUTDOWN_GRACE).await
}

/// [`serve`], giving connections still open `grace` after `stop` resolved
/// before returning anyway (the connections left are dropped with the runtime).
///
/// hyper is driven directly (not through `axum::serve`) so that a client which
/// sends half a request head and then nothing is cut off after
/// [`HEADER_READ_TIMEOUT`] instead of holding a connection forever.
pub async fn serve_with_grace(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let router = app(state);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, do not spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let service = TowerToHyperService::new(router.clone());
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!(
                grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                "connections still open after the shutdown grace period \
                 (clients that never finished a request); exiting"
            );
        }
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
