//! Open connections: which are idle, closing them on a timer, and making
//! room at the cap by closing the one idle longest.
//!
//! A connection is *busy* while a request handler runs on it (a long poll
//! included) and *idle* otherwise: before its first request, between
//! keep-alive requests, after an HTTP/2 preface, while a request head is still
//! arriving, and while a finished response is still being written. Idle time
//! is what a client that holds sockets without using them costs, so that is
//! what the timer and the cap act on; a busy connection is never cut off here
//! (its handler is bounded by the request timeout).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// One open connection.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    busy: AtomicUsize,
    requests: AtomicU64,
    /// Milliseconds after the registry's start at which it last became idle.
    idle_since_ms: AtomicU64,
    close: Notify,
    registry: Arc<Registry>,
}

/// Held while a request handler runs on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        let connection = &self.0;
        connection
            .idle_since_ms
            .store(connection.registry.now_ms(), Ordering::Relaxed);
        connection.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connection {
    /// Mark a request handler as running until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Whether a request has ever run on this connection.
    pub fn has_started_a_request(&self) -> bool {
        self.requests.load(Ordering::Acquire) > 0
    }

    /// Resolves once a request has started on this connection, or after `limit`.
    pub async fn first_request(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.has_started_a_request() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn idle_for_ms(&self) -> Option<u64> {
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.idle_since_ms.load(Ordering::Relaxed);
        Some(self.registry.now_ms().saturating_sub(since))
    }

    /// Resolves when the connection should be closed: idle for `timeout`,
    /// or chosen to make room at the cap.
    pub async fn closing(&self, timeout: Duration) {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        loop {
            // While busy, look again a timeout later: the handler finishing
            // restarts the idle clock, so no close is missed by more than that.
            let wait_ms = match self.idle_for_ms() {
                Some(idle) if idle >= timeout_ms => return,
                Some(idle) => timeout_ms - idle,
                None => timeout_ms,
            };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                () = self.close.notified() => return,
            }
        }
    }
}

/// A streamed response holds its connection busy (see [`crate::http::KeepBusy`]).
impl crate::http::Hold for Connection {
    fn hold(self: Arc<Self>) -> Box<dyn Send + Sync> {
        Box::new(self.busy())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Every open connection of one server.
#[derive(Debug)]
pub struct Registry {
    started: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, std::sync::Weak<Connection>>>,
}

impl Registry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Register a connection just accepted (idle from now); it leaves the
    /// registry when the returned handle and its guards are dropped.
    pub fn open(self: &Arc<Self>) -> Arc<Connection> {
        let connection = Arc::new(Connection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            busy: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
            registry: self.clone(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(connection.id, Arc::downgrade(&connection));
        connection
    }

    /// Connections open now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no connection is open.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ask the connection idle longest to close. False when every open
    /// connection is busy.
    pub fn close_longest_idle(&self) -> bool {
        let open: Vec<Arc<Connection>> = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let longest = open
            .iter()
            .filter_map(|c| Some((c.idle_for_ms()?, c)))
            .max_by_key(|(idle, _)| *idle);
        match longest {
            Some((_, connection)) => {
                // Out of the count at once, so the next accept does not pick it again.
                self.open
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&connection.id);
                connection.close.notify_one();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_connections_close_on_the_timer_and_busy_ones_do_not() {
        let registry = Registry::new();
        let idle = registry.open();
        let busy = registry.open();
        let guard = busy.busy();
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        idle.closing(timeout).await;
        assert!(started.elapsed() >= timeout);
        let waited = tokio::time::timeout(timeout * 3, busy.closing(timeout)).await;
        assert!(waited.is_err(), "a busy connection is not closed");
        drop(guard);
        let started = Instant::now();
        busy.closing(timeout).await;
        assert!(started.elapsed() >= timeout);
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_is_chosen() {
        let registry = Registry::new();
        let oldest = registry.open();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let busy = registry.open();
        let _guard = busy.busy();
        let newer = registry.open();
        assert_eq!(registry.len(), 3);
        assert!(registry.close_longest_idle());
        assert_eq!(registry.len(), 2);
        // The oldest idle one was told to close; the newer one was not.
        tokio::time::timeout(Duration::from_secs(10), oldest.closing(Duration::MAX))
            .await
            .expect("told to close");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), newer.closing(Duration::MAX))
                .await
                .is_err()
        );
        assert!(registry.close_longest_idle());
        assert!(!registry.close_longest_idle(), "only a busy one is left");
        drop(newer);
        drop(oldest);
        assert_eq!(registry.len(), 1);
    }
}
