//! One accepted connection served on its own task within the server's
//! limits, and failed accepts logged without flooding the log.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Limits, connections};

/// How long a connection accepted before shutdown, on which no request has
/// started yet, may take to start one once shutdown begins. Its request is
/// most likely already on the way; a silent one is closed after this.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(5);

/// What every connection of one server shares.
pub(super) struct Shared {
    pub(super) router: axum::Router,
    pub(super) builder: hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    pub(super) registry: Arc<connections::Registry>,
    pub(super) limits: Limits,
    pub(super) stopping: watch::Sender<bool>,
}

impl Shared {
    /// Serve one accepted connection on its own task, within the limits.
    pub(super) fn serve(self: &Arc<Self>, stream: tokio::net::TcpStream) {
        use hyper_util::rt::TokioIo;

        if self.registry.len() >= self.limits.max_connections && !self.registry.close_longest_idle()
        {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                "connection refused: at the connection cap and every connection is busy"
            );
            return;
        }
        let connection = self.registry.open();
        let service = {
            let (router, connection) = (self.router.clone(), connection.clone());
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let busy = connection.busy();
                let mut request = request.map(axum::body::Body::new);
                // A streamed response (the history feed) keeps its
                // connection busy past its handler, for as long as it streams.
                request
                    .extensions_mut()
                    .insert(crate::http::KeepBusy(connection.clone()));
                let response = tower::ServiceExt::oneshot(router.clone(), request);
                async move {
                    let response = response.await;
                    drop(busy);
                    response
                }
            })
        };
        let server = self.clone();
        tokio::spawn(async move {
            let served = server
                .builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::pin!(served);
            let idle_timeout = server.limits.idle_timeout;
            let mut stopping = server.stopping.subscribe();
            // Dropping the connection (returning) closes its socket.
            tokio::select! {
                _ = served.as_mut() => return,
                () = connection.closing(idle_timeout) => return,
                _ = stopping.wait_for(|s| *s) => {}
            }
            if !connection.has_started_a_request() {
                tokio::select! {
                    _ = served.as_mut() => return,
                    () = connection.closing(idle_timeout) => return,
                    () = connection.first_request(FIRST_REQUEST_GRACE) => {}
                }
            }
            // Finish the request in progress, then close.
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        });
    }
}

/// Failed accepts, logged at most once a second so that a flood of
/// connections while out of file descriptors does not flood the log too.
#[derive(Default)]
pub(super) struct AcceptFailures {
    logged_at: Option<std::time::Instant>,
    unlogged: u64,
}

impl AcceptFailures {
    pub(super) fn record(&mut self, error: &std::io::Error) {
        self.unlogged += 1;
        if self
            .logged_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        tracing::warn!(
            error = %error,
            failures = self.unlogged,
            "accept failed (out of file descriptors? raise `ulimit -n` or lower --max-connections); \
             closing the connection idle longest"
        );
        self.logged_at = Some(std::time::Instant::now());
        self.unlogged = 0;
    }
}
