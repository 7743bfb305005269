//! A TCP proxy in front of PostgreSQL that can cut, stall or pass its
//! connections: the outage the tests put the service through.

use super::*;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Forward to the server.
    Open,
    /// Close live connections; accept new ones and close them at once (the
    /// server is down or restarting).
    Refuse,
    /// Close live connections; accept new ones and never answer (packets to
    /// the server are dropped).
    Hold,
    /// Keep live connections but pass nothing either way, and hold new ones:
    /// a network partition that neither side is told about.
    Stall,
}

/// A TCP forwarder on 127.0.0.1:0 whose mode the test switches.
pub(super) struct Proxy {
    pub(super) addr: SocketAddr,
    pub(super) mode: watch::Sender<Mode>,
    pub(super) forwarded: Arc<AtomicU64>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(super) async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, watching) = watch::channel(Mode::Open);
        let forwarded = Arc::new(AtomicU64::new(0));
        let counter = forwarded.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let current = *watching.borrow();
                match current {
                    Mode::Open => {
                        counter.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(forward(inbound, upstream.clone(), watching.clone()));
                    }
                    Mode::Refuse => drop(inbound),
                    Mode::Hold | Mode::Stall => {
                        let mut watching = watching.clone();
                        tokio::spawn(async move {
                            // Silent until the cut is lifted, then closed.
                            let _ = watching.wait_for(|m| *m == Mode::Open).await;
                            drop(inbound);
                        });
                    }
                }
            }
        });
        Self {
            addr,
            mode,
            forwarded,
            task,
        }
    }

    pub(super) fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forward until either side closes or the proxy is cut; then drop both ends.
/// While stalled, bytes wait in the proxy and flow again when it reopens.
pub(super) async fn forward(inbound: TcpStream, upstream: String, mode: watch::Receiver<Mode>) {
    let Ok(outbound) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (from_client, to_client) = inbound.into_split();
    let (from_server, to_server) = outbound.into_split();
    tokio::select! {
        () = pump(from_client, to_server, mode.clone()) => {}
        () = pump(from_server, to_client, mode) => {}
    }
}

/// Copy one direction, honouring the mode between reads and writes.
pub(super) async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buf) => Some(read),
            _ = mode.wait_for(|m| *m != Mode::Open) => None,
        };
        let n = match read {
            Some(Ok(0) | Err(_)) => return,
            Some(Ok(n)) => n,
            // Cut or stalled: reads are cancel-safe, nothing was taken. A
            // stall is waited out below; a cut ends the connection.
            None => 0,
        };
        let now = mode.wait_for(|m| *m != Mode::Stall).await.ok().map(|m| *m);
        if now != Some(Mode::Open) {
            return;
        }
        if n > 0 && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
