//! A TCP proxy between settled and PostgreSQL that can delay, stall and cut.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to the bytes passing through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Hold every chunk this long before passing it on.
    Delay(Duration),
    /// Pass nothing until the mode changes (connections stay open).
    Stall,
}

/// A running proxy: set its mode, or cut every open connection.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    mode: Arc<watch::Sender<Mode>>,
    /// Bumped to close every connection open at the time.
    cuts: Arc<watch::Sender<u64>>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `upstream` (host:port).
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Mode::Pass);
        let (cuts, _) = watch::channel(0_u64);
        let proxy = Self {
            port,
            mode: Arc::new(mode),
            cuts: Arc::new(cuts),
        };
        let served = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let served = served.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        served.pipe(client, server).await;
                    }
                });
            }
        });
        Ok(proxy)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Close every connection open now; new ones are accepted as before.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    async fn pipe(&self, client: TcpStream, server: TcpStream) {
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let mut cuts = self.cuts.subscribe();
        cuts.mark_unchanged();
        let up = forward(cr, sw, self.mode.subscribe());
        let down = forward(sr, cw, self.mode.subscribe());
        tokio::select! {
            _ = up => {}
            _ = down => {}
            _ = cuts.changed() => {}
        }
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Stall => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
