//! TCP keepalives and `TCP_USER_TIMEOUT` on every connection to PostgreSQL,
//! so that a server that vanished without a reset (a host powered off, a
//! network partition, a virtual IP moved away) is noticed within
//! `--pg-tcp-timeout-ms` instead of the system's default of hours: an idle
//! connection through its keepalive probes, a busy one through its unacked
//! data. sqlx opens its sockets itself and gives no way to set options on
//! them, so they are found after each connect among this process's open file
//! descriptors by their peer address (Linux; elsewhere nothing is set, and
//! the store's per-call time limit is what bounds a silent server).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// Socket settings that notice a server that stopped answering without a
/// reset; `None` leaves the system's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpTimeouts {
    /// Idle time before the first keepalive probe, the time between probes,
    /// and how many unanswered probes end the connection.
    pub keepalive: Option<(Duration, Duration, u32)>,
    /// How long sent data may stay unacknowledged (`TCP_USER_TIMEOUT`).
    pub user_timeout: Option<Duration>,
}

impl TcpTimeouts {
    /// Give up on a silent server after about `total`: the keepalive probes
    /// start at half of it, a second or more apart (the kernel counts whole
    /// seconds), until the rest is used. Zero turns both off.
    #[must_use]
    pub fn within(total: Duration) -> Self {
        if total.is_zero() {
            return Self::default();
        }
        let total_s = total.as_secs().max(1);
        let idle = (total_s / 2).max(1);
        let interval = (total_s / 10).max(1);
        let count = u32::try_from(((total_s - idle) / interval).max(1)).unwrap_or(u32::MAX);
        Self {
            keepalive: Some((
                Duration::from_secs(idle),
                Duration::from_secs(interval),
                count,
            )),
            user_timeout: Some(total),
        }
    }
}

/// Set `timeouts` on every open TCP socket of this process whose peer is
/// one of `peers`; setting them again on a socket that has them changes
/// nothing. Returns how many sockets were set.
pub fn apply(peers: &HashSet<SocketAddr>, timeouts: TcpTimeouts) -> usize {
    if peers.is_empty() || timeouts == TcpTimeouts::default() {
        return 0;
    }
    imp::apply(peers, timeouts)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::collections::HashSet;
    use std::net::SocketAddr;
    use std::os::fd::{BorrowedFd, RawFd};

    use socket2::{SockRef, TcpKeepalive};

    use super::TcpTimeouts;

    pub fn apply(peers: &HashSet<SocketAddr>, timeouts: TcpTimeouts) -> usize {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return 0;
        };
        let mut set = 0;
        for entry in entries.flatten() {
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<RawFd>().ok())
            else {
                continue;
            };
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
            if !is_socket {
                continue;
            }
            // SAFETY: the descriptor is borrowed only to duplicate it, and
            // the options are set on the duplicate, which this function owns.
            // Should another thread close the number and have it reused in
            // between, the duplicate is of that file instead: on a socket the
            // options are harmless, anything else is not a socket and skipped.
            let Ok(fd) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
                continue;
            };
            let socket = SockRef::from(&fd);
            let peer = socket.peer_addr().ok().and_then(|a| a.as_socket());
            if !peer.is_some_and(|p| peers.contains(&p)) {
                continue;
            }
            if let Some((idle, interval, count)) = timeouts.keepalive {
                let keepalive = TcpKeepalive::new()
                    .with_time(idle)
                    .with_interval(interval)
                    .with_retries(count);
                let _ = socket.set_tcp_keepalive(&keepalive);
            }
            if let Some(timeout) = timeouts.user_timeout {
                let _ = socket.set_tcp_user_timeout(Some(timeout));
            }
            set += 1;
        }
        set
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::collections::HashSet;
    use std::net::SocketAddr;

    use super::TcpTimeouts;

    pub fn apply(_peers: &HashSet<SocketAddr>, _timeouts: TcpTimeouts) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn sockets_to_the_peer_get_the_options_and_others_do_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to_peer = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let to_other = tokio::net::TcpStream::connect(other.local_addr().unwrap())
            .await
            .unwrap();
        let peers = HashSet::from([listener.local_addr().unwrap()]);
        let timeouts = TcpTimeouts::within(Duration::from_secs(4));
        assert_eq!(apply(&peers, timeouts), 1);
        let set = socket2::SockRef::from(&to_peer);
        assert!(set.keepalive().unwrap());
        assert_eq!(set.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
        assert_eq!(
            set.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(4))
        );
        let unset = socket2::SockRef::from(&to_other);
        assert!(!unset.keepalive().unwrap());
        assert_eq!(unset.tcp_user_timeout().unwrap(), None);
    }
}
