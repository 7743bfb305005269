//! The task that follows the writer: a look once a second, and a search
//! over every host when a look or a request says the writer is gone.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sqlx::postgres::PgPool;
use sqlx::{Connection, PgConnection};

use super::{Primary, READ_ONLY, Suspicion};
use crate::store::explain;

/// A writer's timeline: the first 8 hex digits of its WAL file name. A
/// promotion starts a new one, so a changed timeline is a failover even
/// behind one unchanged host name. Asked apart from [`READ_ONLY`]: a server
/// that refuses it is still a writer, only one whose failovers are told by
/// host alone.
const TIMELINE: &str = "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)";

/// Waits between search rounds that found no writable server.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);
/// How often the writer in use is asked whether it still takes writes.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The least time between two searches that found the same writer: errors
/// that are no failover (an overloaded server) must not turn into a storm
/// of connection attempts.
const SAME_WRITER_GAP: Duration = Duration::from_secs(1);
/// After a fence, a read-only answer is taken for a straggler (a request
/// that was running on a fenced connection) unless the search then finds
/// another server: it fences nothing more.
const STRAGGLERS: Duration = Duration::from_secs(10);
/// How long start-up waits for a primary while the hosts answer as standbys.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// What a host that answers but takes no writes is said to be.
const READ_ONLY_SAID: &str = "a standby or a read-only server: it accepts no writes";
/// After the first writable answer, how long the other hosts may still
/// answer: of two writers (a split brain), the one on the later timeline wins.
const SECOND_OPINION: Duration = Duration::from_millis(200);

/// What one host answered.
enum Answer {
    /// It takes writes; its timeline, where it could be read.
    Writer(Option<String>),
    /// It does not, or cannot be reached: why.
    No(String),
}

impl Primary {
    /// At start-up: the first writable host, or what each host answered.
    /// While some host answers but none takes writes (a failover under way:
    /// the old primary demoted, the new one not yet promoted), it waits up
    /// to [`START_PATIENCE`] rather than exit, so that a supervisor does not
    /// restart it in a loop; unreachable hosts alone fail at once.
    pub async fn find_at_start(&self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + START_PATIENCE;
        let (found, timeline) = loop {
            match self.search_once().await {
                Ok(found) => break found,
                Err(said)
                    if said.contains(READ_ONLY_SAID) && tokio::time::Instant::now() < deadline =>
                {
                    tracing::warn!(hosts = %said, "no PostgreSQL server accepts writes yet; waiting for a primary");
                    tokio::time::sleep(LONGEST_PAUSE).await;
                }
                Err(said) => return Err(said),
            }
        };
        self.current.store(found, Ordering::Release);
        *self.timeline.lock().unwrap_or_else(PoisonError::into_inner) = timeline;
        Ok(())
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
                // A wake during the look (a request's connection failed)
                // searches at once rather than after the look's time runs out.
                let looked = tokio::select! {
                    looked = self.look(&mut watch) => looked,
                    () = self.wake.notified() => Some(Suspicion::Unreachable),
                };
                match looked {
                    None => continue,
                    Some(why) => {
                        tracing::warn!(?why, "the PostgreSQL writer stopped answering as one");
                        if why == Suspicion::Unwritable {
                            self.must_fence.store(true, Ordering::Release);
                            self.set_unwritable(
                                "the database server accepts no writes (a standby, or \
                                 read-only): looking for the primary",
                            );
                        }
                    }
                }
            }
            watch = None;
            let mut pause = FIRST_PAUSE;
            loop {
                let began = self.now_us();
                let searched = self.search_once().await;
                self.searched.send_modify(|n| *n += 1);
                match searched {
                    Ok((found, timeline)) => {
                        if !self.settle_on(found, timeline, &pool) {
                            tokio::time::sleep(SAME_WRITER_GAP).await;
                        }
                        break;
                    }
                    // The probes failed, but the writer in use answered since
                    // they began: they were cut off by an outage that is over.
                    // Leave the gate open and look again.
                    Err(said) if self.vouched_since(began) => {
                        tracing::info!(hosts = %said, "a search failed while the writer in use answered; looking again");
                    }
                    Err(said) => {
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
                if db.code().is_some_and(|code| super::is_unwritable(&code)) =>
            {
                Some(Suspicion::Unwritable)
            }
            Ok(Err(_)) | Err(_) => {
                *watch = None;
                Some(Suspicion::Unreachable)
            }
        }
    }

    /// Point the pool at the writer found; true when it is another server
    /// than before or connections were fenced.
    fn settle_on(&self, found: usize, timeline: Option<String>, pool: &PgPool) -> bool {
        let before = self.current.swap(found, Ordering::AcqRel);
        let earlier = std::mem::replace(
            &mut *self.timeline.lock().unwrap_or_else(PoisonError::into_inner),
            timeline.clone(),
        );
        // Another host, or a promotion behind the same one.
        let failover =
            before != found || matches!((&earlier, &timeline), (Some(a), Some(b)) if a != b);
        let fenced_lately = self.fence_us.load(Ordering::Acquire) > 0
            && self
                .now_us()
                .saturating_sub(self.fence_us.load(Ordering::Acquire))
                < u64::try_from(STRAGGLERS.as_micros()).unwrap_or(u64::MAX);
        let read_only_seen = self.must_fence.swap(false, Ordering::AcqRel);
        let fence = failover || (read_only_seen && !fenced_lately);
        if fence {
            pool.set_connect_options(self.hosts[found].options.clone());
            self.fence_us.store(self.now_us(), Ordering::Release);
            self.generation.send_modify(|g| *g += 1);
        }
        if failover {
            self.failovers.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                from = %self.hosts[before].label,
                to = %self.hosts[found].label,
                timeline = timeline.as_deref().unwrap_or("unknown"),
                "the PostgreSQL writer changed: connections opened before now are closed"
            );
        } else if fence {
            tracing::info!(host = %self.hosts[found].label, "a connection answered read-only: PostgreSQL connections opened before now are closed");
        }
        // A read-only answer that came in meanwhile asks for another search.
        if !self.must_fence.load(Ordering::Acquire) {
            self.writable.store(true, Ordering::Release);
        }
        fence
    }

    /// Probe every host at once. The first writer to answer wins, unless
    /// another answers within [`SECOND_OPINION`] on a later timeline. The
    /// error lists what each host said, for the start-up message and the log.
    async fn search_once(&self) -> Result<(usize, Option<String>), String> {
        // Resolved beside the probes, within the connect timeout: a slow
        // resolver only delays the socket options of the connections to come.
        let resolving = tokio::time::timeout(self.connect_timeout, self.resolve());
        let mut probes: FuturesUnordered<_> = (0..self.hosts.len())
            .map(|i| async move { (i, self.probe(i).await) })
            .collect();
        let probing = async {
            let mut said = vec![String::new(); self.hosts.len()];
            let mut best: Option<(usize, Option<String>)> = None;
            loop {
                let next = match &best {
                    None => probes.next().await,
                    Some(_) => tokio::time::timeout(SECOND_OPINION, probes.next())
                        .await
                        .unwrap_or(None),
                };
                let Some((i, answer)) = next else { break };
                match answer {
                    Answer::Writer(timeline) => {
                        let later = best.as_ref().is_none_or(
                            |(_, held)| matches!((held, &timeline), (Some(a), Some(b)) if b > a),
                        );
                        if later {
                            best = Some((i, timeline));
                        }
                    }
                    Answer::No(why) => said[i] = format!("{}: {why}", self.hosts[i].label),
                }
            }
            best.ok_or_else(|| said.join("; "))
        };
        let (_, found) = tokio::join!(resolving, probing);
        found
    }

    /// Resolve every host again (a DNS name may point elsewhere now).
    async fn resolve(&self) {
        let mut found = HashSet::new();
        for host in &self.hosts {
            if let Some(addr) = host.address {
                found.insert(addr);
                continue;
            }
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

    /// Connect to host `i` and ask whether it takes writes, and if so its
    /// timeline (best-effort).
    async fn probe(&self, i: usize) -> Answer {
        let options = &self.hosts[i].options;
        let attempt = async {
            let mut conn = PgConnection::connect_with(options).await?;
            self.protect_sockets();
            let read_only: bool = sqlx::query_scalar(READ_ONLY).fetch_one(&mut conn).await?;
            let timeline = if read_only {
                None
            } else {
                sqlx::query_scalar::<_, String>(TIMELINE)
                    .fetch_one(&mut conn)
                    .await
                    .ok()
            };
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>((read_only, timeline))
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Ok((false, timeline))) => Answer::Writer(timeline),
            Ok(Ok((true, _))) => Answer::No(READ_ONLY_SAID.into()),
            Ok(Err(e)) => Answer::No(explain::cause(&e)),
            Err(_) => Answer::No(format!(
                "no answer within {} ms",
                self.connect_timeout.as_millis()
            )),
        }
    }
}
