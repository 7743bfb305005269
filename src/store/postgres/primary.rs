//! Following the primary through a failover (docs/high-availability.md).
//!
//! settled writes, so every connection it keeps must be to a server that
//! accepts writes. A failover leaves connections behind that do not: a
//! demoted primary that stays up read-only with its sockets open (Aurora's
//! role flip, a virtual IP or DNS name moved while pooled connections keep
//! their old peer), a standby promoted while the old primary shuts down, or a
//! primary that vanished without a reset. So:
//! - a new connection is used only if its server accepts writes;
//! - a read-only, recovering or shutting-down answer (SQLSTATE 25006, 57P01,
//!   57P02, 57P03) *fences* every connection opened before it: none is lent
//!   out again, and the `LISTEN` and vacuum connections reconnect;
//! - any such answer, or a connection that fails, wakes a search over the
//!   hosts of `--database-url` (all at once; the first writable one wins),
//!   repeated with backoff until one accepts writes. The pool then opens its
//!   connections there.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::sync::{Notify, watch};

use super::conninfo::{Host, TcpTimeouts};
use super::keepalive;
use crate::store::explain;

/// Asks a server whether it accepts writes, as libpq's `read-write` and
/// `primary` checks do together.
const READ_ONLY: &str =
    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'";

/// The same, and a writer's timeline (the first 8 hex digits of its WAL
/// file name): a promotion starts a new one, so a changed timeline is a
/// failover even behind one unchanged host name.
const PROBE: &str = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on', \
     CASE WHEN pg_is_in_recovery() THEN '' \
          ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

/// Waits between search rounds that found no writable server.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// How often the writer in use is asked whether it still takes writes.
const LOOK_EVERY: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Why a search was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspicion {
    /// A server answered that it accepts no writes (or is shutting down):
    /// every connection opened so far may be to it.
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
    /// Connections opened before this (ms after `started`) are not lent out.
    fence_ms: AtomicU64,
    /// Set by an unwritable answer: the next search fences, whichever host it finds.
    must_fence: AtomicBool,
    /// Bumped at each fence: kept connections (`LISTEN`, vacuum) reconnect.
    generation: watch::Sender<u64>,
    wake: Notify,
    /// Addresses the hosts resolve to, for the socket options.
    peers: Mutex<HashSet<SocketAddr>>,
    /// The writer's timeline when last found.
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
            fence_ms: AtomicU64::new(0),
            must_fence: AtomicBool::new(false),
            generation: watch::channel(0).0,
            wake: Notify::new(),
            peers: Mutex::new(HashSet::new()),
            timeline: Mutex::new(None),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
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
    pub fn fenced(&self, age: Duration) -> bool {
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        self.now_ms().saturating_sub(age_ms) < self.fence_ms.load(Ordering::Acquire)
    }

    /// Something went wrong on a connection: look for the writer again.
    pub fn suspect(&self, why: Suspicion) {
        // With one host there is nowhere else to look: the pool reconnects
        // through the same name on its own.
        if why == Suspicion::Unreachable && self.hosts.len() == 1 {
            return;
        }
        if why == Suspicion::Unwritable {
            self.must_fence.store(true, Ordering::Release);
            self.set_unwritable(
                "the database server accepts no writes (read-only, in recovery or shutting \
                 down): looking for the primary",
            );
        }
        self.wake.notify_one();
    }

    fn set_unwritable(&self, reason: &str) {
        self.writable.store(false, Ordering::Release);
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.to_owned());
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
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        keepalive::apply(&peers, self.tcp);
    }

    /// Resolve every host again (a DNS name may point elsewhere now).
    async fn resolve(&self) {
        let mut found = HashSet::new();
        for host in &self.hosts {
            let options = &host.options;
            if options.get_socket().is_some() {
                continue;
            }
            let address = (
                options.get_host().trim_matches(['[', ']']),
                options.get_port(),
            );
            if let Ok(addresses) = tokio::net::lookup_host(address).await {
                found.extend(addresses);
            }
        }
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(found);
    }

    /// Connect to host `i` and ask whether it accepts writes: `Ok(Ok(timeline))`
    /// when it does, `Ok(Err(why))` when it answers but does not.
    async fn probe(&self, i: usize) -> Result<Result<String, String>, String> {
        let options = &self.hosts[i].options;
        let attempt = async {
            let mut conn = PgConnection::connect_with(options).await?;
            self.protect_sockets();
            let answer: (bool, String) = sqlx::query_as(PROBE).fetch_one(&mut conn).await?;
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>(answer)
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Ok((false, timeline))) => Ok(Ok(timeline)),
            Ok(Ok((true, _))) => Ok(Err(
                "a standby or a read-only server: it accepts no writes".into()
            )),
            Ok(Err(e)) => Err(explain::cause(&e)),
            Err(_) => Err(format!(
                "no answer within {} ms",
                self.connect_timeout.as_millis()
            )),
        }
    }

    /// Probe every host at once; the first that accepts writes wins. The
    /// error lists what each host said, for the start-up message and the log.
    async fn search_once(&self) -> Result<(usize, String), String> {
        self.resolve().await;
        let mut probes: FuturesUnordered<_> = (0..self.hosts.len())
            .map(|i| async move { (i, self.probe(i).await) })
            .collect();
        let mut said = vec![String::new(); self.hosts.len()];
        while let Some((i, answer)) = probes.next().await {
            match answer {
                Ok(Ok(timeline)) => return Ok((i, timeline)),
                Ok(Err(why)) | Err(why) => said[i] = format!("{}: {why}", self.hosts[i].label),
            }
        }
        Err(said.join("; "))
    }

    /// At start-up: the first writable host, or why there is none.
    pub async fn find_at_start(&self) -> Result<usize, String> {
        let (found, timeline) = self.search_once().await?;
        self.current.store(found, Ordering::Release);
        *self.timeline.lock().unwrap_or_else(PoisonError::into_inner) = Some(timeline);
        Ok(found)
    }

    /// Keep following the writer, pointing `pool` at it, until aborted
    /// (the store's drop). The task holds the pool, never the other way
    /// round, so that dropping the store frees both. Between searches it
    /// asks the writer once a second, on a connection of its own, whether it
    /// still takes writes: a demotion is seen without waiting for a write to
    /// fail, and a silent server within the TCP timeout rather than when a
    /// request's time runs out.
    pub async fn follow(self: Arc<Self>, pool: PgPool) {
        let mut watch = None;
        loop {
            let woken = tokio::time::timeout(LOOK_EVERY, self.wake.notified())
                .await
                .is_ok();
            if !woken {
                match self.look(&mut watch).await {
                    None => continue,
                    Some(why) => {
                        tracing::warn!(?why, "the PostgreSQL writer stopped answering as one");
                        if why == Suspicion::Unwritable {
                            self.suspect(why);
                        }
                    }
                }
            }
            watch = None;
            let mut pause = FIRST_PAUSE;
            loop {
                match self.search_once().await {
                    Ok((found, timeline)) => {
                        self.settle_on(found, timeline, &pool);
                        break;
                    }
                    Err(said) => {
                        // Both a definite "read-only" and silence end here.
                        self.set_unwritable(
                            "no database server in --database-url accepts writes: looking for \
                             the primary",
                        );
                        tracing::warn!(hosts = %said, "no PostgreSQL server accepts writes; trying again");
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }

    /// Ask the writer in use whether it still takes writes, within the TCP
    /// timeout (or the connect timeout when that is off); `None` when it does.
    async fn look(&self, watch: &mut Option<PgConnection>) -> Option<Suspicion> {
        let bound = self.tcp.user_timeout.unwrap_or(self.connect_timeout);
        let asked = tokio::time::timeout(bound, async {
            if watch.is_none() {
                *watch = Some(PgConnection::connect_with(&self.options()).await?);
                self.protect_sockets();
            }
            match watch.as_mut() {
                Some(conn) => {
                    sqlx::query_scalar::<_, bool>(READ_ONLY)
                        .fetch_one(conn)
                        .await
                }
                None => Err(sqlx::Error::PoolClosed),
            }
        })
        .await;
        match asked {
            Ok(Ok(false)) => None,
            Ok(Ok(true)) => Some(Suspicion::Unwritable),
            Ok(Err(sqlx::Error::Database(db)))
                if db.code().is_some_and(|code| is_unwritable(&code)) =>
            {
                Some(Suspicion::Unwritable)
            }
            Ok(Err(_)) | Err(_) => {
                *watch = None;
                Some(Suspicion::Unreachable)
            }
        }
    }

    fn settle_on(&self, found: usize, timeline: String, pool: &PgPool) {
        let before = self.current.swap(found, Ordering::AcqRel);
        let earlier = self
            .timeline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(timeline.clone());
        // A new host, or a promotion behind the same one.
        let failover = before != found || earlier.is_some_and(|t| t != timeline);
        // A connection that answered read-only or shutting down is to go
        // either way (`pg_terminate_backend` answers 57P01 too).
        let fence = self.must_fence.swap(false, Ordering::AcqRel) || failover;
        if fence {
            pool.set_connect_options(self.hosts[found].options.clone());
            self.fence_ms.store(self.now_ms(), Ordering::Release);
            self.generation.send_modify(|g| *g += 1);
        }
        if failover {
            self.failovers.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                from = %self.hosts[before].label,
                to = %self.hosts[found].label,
                timeline = %timeline,
                "the PostgreSQL writer changed: connections opened before now are closed"
            );
        } else if fence {
            tracing::info!(host = %self.hosts[found].label, "PostgreSQL connections opened before now are closed");
        }
        self.writable.store(true, Ordering::Release);
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether a pooled connection may be lent out: not if it was opened
    /// before the last fence, nor if it does not answer a ping within the TCP
    /// timeout (sqlx's own ping, which this replaces, has no bound: on a
    /// silent server it would hold the request for the whole acquire timeout).
    pub async fn lend(&self, conn: &mut PgConnection, age: Duration) -> sqlx::Result<bool> {
        if self.fenced(age) {
            return Ok(false);
        }
        let bound = self.tcp.user_timeout.unwrap_or(self.connect_timeout);
        let error = match tokio::time::timeout(bound, conn.ping()).await {
            Ok(Ok(())) => return Ok(true),
            Ok(Err(error)) => error,
            Err(_) => sqlx::Error::PoolTimedOut,
        };
        // The pool opens a new connection next, with the options it has
        // then: give the search a moment to point them elsewhere, or that
        // connection goes to the silent server too and the request waits out
        // its whole acquire timeout.
        if self.hosts.len() > 1 {
            let mut generation = self.generation.subscribe();
            self.suspect(Suspicion::Unreachable);
            let _ = tokio::time::timeout(Duration::from_secs(1), generation.changed()).await;
        }
        Err(error)
    }

    /// Check a connection just opened for the pool: it must accept writes.
    pub async fn accept(&self, conn: &mut PgConnection) -> sqlx::Result<()> {
        self.protect_sockets();
        let read_only: bool = sqlx::query_scalar(READ_ONLY).fetch_one(&mut *conn).await?;
        if read_only {
            self.suspect(Suspicion::Unwritable);
            return Err(sqlx::Error::Protocol(
                "the server accepts no writes (a standby or read-only)".into(),
            ));
        }
        Ok(())
    }
}

/// Whether a SQLSTATE says the server will not take writes on this
/// connection: read-only (a standby or a demoted primary), or shutting down.
#[must_use]
pub fn is_unwritable(code: &str) -> bool {
    matches!(code, "25006" | "57P01" | "57P02" | "57P03")
}
