//! Following the primary through a failover (docs/high-availability.md).
//!
//! settled writes, so every connection it keeps must be to a server that
//! accepts writes. A failover leaves connections behind that do not: a
//! demoted primary that stays up read-only with its sockets open (Aurora's
//! role flip, a virtual IP or DNS name moved while pooled connections keep
//! their old peer), a standby promoted while the old primary shuts down, or a
//! primary that vanished without a reset. So:
//! - a new connection is used only if its server accepts writes;
//! - a read-only answer (SQLSTATE 25006, or 57P03 on connect) or a
//!   connection that fails wakes a search over the hosts of `--database-url`
//!   (`follow.rs`), repeated with backoff until one accepts writes;
//! - when the writer found is another server (another host, or a new
//!   timeline behind the same name), or a connection answered read-only, the
//!   search *fences* every connection opened before it: none is lent out
//!   again, and the `LISTEN` and upkeep connections reconnect. The pool then
//!   opens its connections at the writer.

mod follow;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::PgConnection;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::{Notify, watch};

use super::conninfo::Host;
use super::keepalive;
use super::keepalive::TcpTimeouts;
use crate::domain::{BackendFault, StoreError};

/// Asks a server whether it refuses writes.
const READ_ONLY: &str = concat!("SELECT ", refuses_writes!());

/// Why a search was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspicion {
    /// A server answered that it accepts no writes: every connection opened
    /// so far may be to it.
    Unwritable,
    /// A connection failed or timed out: the server may be gone.
    Unreachable,
}

/// What a replica knows of its database servers, for `/v1/info`,
/// `/metrics` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterState {
    /// The host in use (`host:port` as the URL names it).
    pub primary: String,
    /// Whether the last word from it is that it accepts writes.
    pub writable: bool,
    /// Why not, when not (no host names: `/readyz` is public).
    pub reason: Option<String>,
    /// How many times this replica moved its connections to a new writer.
    pub failovers: u64,
    /// Every host of the URL, in order.
    pub hosts: Vec<String>,
}

/// The hosts, which one is in use, and the fence.
pub struct Primary {
    hosts: Vec<Host>,
    connect_timeout: Duration,
    tcp: TcpTimeouts,
    started: Instant,
    current: AtomicUsize,
    writable: AtomicBool,
    reason: Mutex<Option<String>>,
    failovers: AtomicU64,
    /// Connections opened before this (µs after `started`) are not lent out.
    fence_us: AtomicU64,
    /// When (µs after `started`, plus one) a pooled connection last answered
    /// that its server takes writes: a search that began before it and then
    /// failed (its probe cut off by the outage that just ended) must not
    /// close the gate on a writer already answering.
    vouched_us: AtomicU64,
    /// Set by a read-only answer: the next search fences, whichever server
    /// it finds, unless a fence came just before (a straggler's answer).
    must_fence: AtomicBool,
    /// Bumped at each fence: kept connections (`LISTEN`, vacuum) reconnect.
    generation: watch::Sender<u64>,
    /// Bumped at the end of every search round, fenced or not.
    searched: watch::Sender<u64>,
    wake: Notify,
    /// Addresses the hosts resolve to, for the socket options.
    peers: Mutex<HashSet<SocketAddr>>,
    /// The writer's timeline when last found, where it could be read.
    timeline: Mutex<Option<String>>,
}

impl Primary {
    /// `hosts` in the URL's order; the search starts from the first.
    pub fn new(hosts: Vec<Host>, connect_timeout: Duration, tcp: TcpTimeouts) -> Arc<Self> {
        Arc::new(Self {
            hosts,
            connect_timeout,
            tcp,
            started: Instant::now(),
            current: AtomicUsize::new(0),
            writable: AtomicBool::new(true),
            reason: Mutex::new(None),
            failovers: AtomicU64::new(0),
            fence_us: AtomicU64::new(0),
            vouched_us: AtomicU64::new(0),
            must_fence: AtomicBool::new(false),
            generation: watch::channel(0).0,
            searched: watch::channel(0).0,
            wake: Notify::new(),
            peers: Mutex::new(HashSet::new()),
            timeline: Mutex::new(None),
        })
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Connect options of the host in use.
    pub fn options(&self) -> PgConnectOptions {
        self.hosts[self.current.load(Ordering::Acquire)]
            .options
            .clone()
    }

    /// Changes each time connections are fenced.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Whether a connection `age` old was opened before the last fence.
    /// sqlx counts a pooled connection's age from the end of `after_connect`
    /// ([`Self::accept`]), so a connection accepted after a fence is never
    /// taken for one opened before it.
    pub fn fenced(&self, age: Duration) -> bool {
        let age_us = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        self.now_us().saturating_sub(age_us) < self.fence_us.load(Ordering::Acquire)
    }

    /// Something went wrong on a connection: look for the writer again.
    pub fn suspect(&self, why: Suspicion) {
        // With one host there is nowhere else to look: the pool reconnects
        // through the same name on its own, and the writer check
        // (`follow.rs`) notices a new server behind it.
        if why == Suspicion::Unreachable && self.hosts.len() == 1 {
            return;
        }
        if why == Suspicion::Unwritable {
            self.must_fence.store(true, Ordering::Release);
            self.set_unwritable(
                "the database server accepts no writes (a standby, or read-only): looking for \
                 the primary",
            );
        }
        self.wake.notify_one();
    }

    /// Pass a store call's `result` on; a failure that says something about
    /// the server makes the replica look for the writer again.
    pub fn watch<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Backend { fault, .. }) = &result {
            match fault {
                BackendFault::WriterLost => self.suspect(Suspicion::Unwritable),
                BackendFault::Connection => self.suspect(Suspicion::Unreachable),
                BackendFault::Answered => {}
            }
        }
        result
    }

    /// A connection just answered that its server takes writes. That opens
    /// the gate a failed search closed (a search that began before the
    /// outage ended can fail after it), unless a read-only answer is still to
    /// be searched out: connections opened before it may be to that server.
    pub fn vouch(&self) {
        self.vouched_us.store(self.now_us() + 1, Ordering::Release);
        if !self.must_fence.load(Ordering::Acquire) {
            self.writable.store(true, Ordering::Release);
        }
    }

    /// Whether a connection vouched for the writer at or after `since_us`.
    fn vouched_since(&self, since_us: u64) -> bool {
        self.vouched_us.load(Ordering::Acquire) > since_us
    }

    /// Refuse at once while no writer is known: a connection would only be
    /// opened to a server that takes no writes, and refused after it.
    pub fn gate(&self) -> Result<(), StoreError> {
        if self.writable.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(StoreError::backend_fault(
            BackendFault::WriterLost,
            "no PostgreSQL server takes writes yet: looking for the primary",
        ))
    }

    fn set_unwritable(&self, reason: &str) {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.to_owned());
        self.writable.store(false, Ordering::Release);
    }

    /// What `/v1/info`, `/metrics` and `/readyz` show.
    pub fn state(&self) -> WriterState {
        let writable = self.writable.load(Ordering::Acquire);
        WriterState {
            primary: self.hosts[self.current.load(Ordering::Acquire)]
                .label
                .clone(),
            writable,
            reason: if writable {
                None
            } else {
                self.reason
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            },
            failovers: self.failovers.load(Ordering::Acquire),
            hosts: self.hosts.iter().map(|h| h.label.clone()).collect(),
        }
    }

    /// Set the socket options on every connection to one of the hosts.
    pub fn protect_sockets(&self) {
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        keepalive::apply(&peers, self.tcp);
    }

    /// How long a pooled connection's ping may take before it is given up:
    /// far more than a live server needs, and short of the acquire timeout
    /// so that the request can still get another connection.
    fn ping_bound(&self) -> Duration {
        let quarter = self.connect_timeout / 4;
        self.tcp
            .user_timeout
            .map_or(quarter, |tcp| tcp.min(quarter))
            .max(Duration::from_millis(250))
    }

    /// Whether a pooled connection may be lent out: not if it was opened
    /// before the last fence, nor if it does not answer a ping within
    /// [`Self::ping_bound`] (sqlx's own ping, which this replaces, has no
    /// bound: on a silent server it would hold the request for the whole
    /// acquire timeout).
    pub async fn lend(&self, conn: &mut PgConnection, age: Duration) -> sqlx::Result<bool> {
        if self.fenced(age) {
            return Ok(false);
        }
        match tokio::time::timeout(self.ping_bound(), sqlx::Connection::ping(conn)).await {
            Ok(pinged) => pinged.map(|()| true),
            Err(_) => {
                // The pool opens a new connection next, with the options it
                // has then: give a search a moment to point them elsewhere,
                // or that connection goes to the silent server too.
                if self.hosts.len() > 1 {
                    let mut searched = self.searched.subscribe();
                    self.suspect(Suspicion::Unreachable);
                    let _ = tokio::time::timeout(Duration::from_secs(1), searched.changed()).await;
                }
                Err(sqlx::Error::PoolTimedOut)
            }
        }
    }

    /// Check a connection just opened for the pool: it must accept writes.
    pub async fn accept(&self, conn: &mut PgConnection) -> sqlx::Result<()> {
        self.protect_sockets();
        let read_only: bool = sqlx::query_scalar(READ_ONLY).fetch_one(&mut *conn).await?;
        if read_only {
            // The pool's options lead to a server that takes no writes: look
            // again. Its own connections are no reason to fence the others.
            self.set_unwritable(
                "the database server accepts no writes (a standby, or read-only): looking for \
                 the primary",
            );
            self.wake.notify_one();
            return Err(sqlx::Error::Protocol(
                "the server accepts no writes (a standby or read-only)".into(),
            ));
        }
        self.vouch();
        Ok(())
    }
}

/// Whether a SQLSTATE says the server takes no writes on this connection:
/// read-only (a standby or a demoted primary), or not accepting connections
/// while it starts up or recovers.
#[must_use]
pub fn is_unwritable(code: &str) -> bool {
    matches!(code, "25006" | "57P03")
}

/// Whether a SQLSTATE says the connection is gone: the server shut down or
/// terminated it (`pg_terminate_backend` too), or a connection exception.
#[must_use]
pub fn is_disconnect(code: &str) -> bool {
    matches!(code, "57P01" | "57P02") || code.starts_with("08")
}
