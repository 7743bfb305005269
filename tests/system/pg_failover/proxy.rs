//! A TCP proxy whose upstream the test switches: new connections go to the
//! current upstream, open ones keep theirs until either side closes them.
//! That is how a failover by DNS or by a virtual IP looks to a client: the
//! same address, a new server behind it for new connections only.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub(super) struct Proxy {
    pub(super) addr: std::net::SocketAddr,
    upstream: watch::Sender<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(super) async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (sender, current) = watch::channel(upstream);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let upstream = current.borrow().clone();
                tokio::spawn(async move {
                    // A server that is not there: the client sees a close.
                    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Self {
            addr,
            upstream: sender,
            task,
        }
    }

    /// Send new connections to `upstream`.
    pub(super) fn switch(&self, upstream: String) {
        self.upstream.send_replace(upstream);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
