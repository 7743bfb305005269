//! The faults, and the schedule that injects them: each kind alone in turn,
//! then several at once (on several replicas) until the run's time is up.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use sqlx::Connection;

use settled_test_support::rng::Rng;

use super::cluster::{Replica, fill, restart_postgres};
use super::ha::Cluster;
use super::proxy::{Mode, Proxy};
use super::workload::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Fault {
    /// SIGKILL a server, start it again on the same database.
    Kill,
    /// SIGSTOP a server for longer than a lease, then SIGCONT.
    PauseServer,
    /// Workers hold what they claim past its lease, then commit.
    PauseWorkers,
    /// `pg_terminate_backend` of every connection of settled's database.
    TerminateBackends,
    /// `pg_ctlcluster … restart` of the PostgreSQL cluster.
    RestartPostgres,
    /// Every chunk between settled and PostgreSQL held 150 ms.
    ProxyDelay,
    /// Nothing passes between settled and PostgreSQL for longer than a lease.
    ProxyStall,
    /// Every connection between settled and PostgreSQL cut, three times.
    ProxyCut,
    /// The SQLite database's filesystem filled up, then freed.
    DiskFull,
    /// One server's wall clock stepped 2 minutes forward, then back.
    ClockStep,
    /// `cluster.sh switchover`: a planned switchover to a standby.
    Switchover,
    /// `cluster.sh kill-primary`: the leader's postmaster SIGKILLed; Patroni
    /// promotes the synchronous standby and the old leader rejoins.
    Failover,
    /// `cluster.sh demote-in-place`: the leader read-only with its sockets
    /// open until a standby is promoted; then `thaw` (it rejoins).
    DemoteInPlace,
    /// Nothing passes the leader's proxy for longer than a lease and than
    /// settled's TCP timeout; connections stay open.
    IsolatePrimary,
    /// `cluster.sh stop-standby`, then `start-standby`.
    LoseStandby,
}

impl Fault {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    /// Whether it acts on the PostgreSQL cluster of `postgres-ha`.
    pub fn on_cluster(self) -> bool {
        matches!(
            self,
            Self::Switchover
                | Self::Failover
                | Self::DemoteInPlace
                | Self::IsolatePrimary
                | Self::LoseStandby
        )
    }

    /// What it acts on: faults on one thing are never injected at once.
    fn lock_keys(self, replica: usize) -> Vec<String> {
        match self {
            Self::Kill | Self::PauseServer | Self::ClockStep => vec![format!("replica-{replica}")],
            Self::PauseWorkers => vec!["workers".into()],
            Self::DiskFull => vec!["disk".into()],
            // The leader's proxy, which the proxy faults act on too.
            Self::IsolatePrimary => vec!["cluster".into(), "database".into()],
            Self::Switchover | Self::Failover | Self::DemoteInPlace | Self::LoseStandby => {
                vec!["cluster".into()]
            }
            _ => vec!["database".into()],
        }
    }
}

/// What the faults act on.
pub struct Target {
    pub replicas: Vec<Arc<Mutex<Replica>>>,
    pub proxy: Option<Proxy>,
    /// The SQLite database's directory, on its own small filesystem.
    pub disk: Option<PathBuf>,
    /// The admin URL of settled's database, for `pg_terminate_backend`.
    pub postgres: Option<(String, String)>,
    /// `postgres-ha`: the cluster, with a proxy per node.
    pub cluster: Option<Arc<Cluster>>,
    pub work: Arc<Workload>,
}

impl Target {
    async fn with_replica<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Replica) -> T + Send + 'static,
    ) -> T {
        let replica = self.replicas[i].clone();
        tokio::task::spawn_blocking(move || {
            f(&mut replica.lock().unwrap_or_else(|p| p.into_inner()))
        })
        .await
        .expect("a replica task panicked")
    }

    /// Start replica `i` again, as often as it takes (the database may be
    /// restarting, the disk full).
    pub async fn restart(&self, i: usize) {
        for attempt in 0.. {
            let started = self
                .with_replica(i, |r| {
                    r.start(Duration::from_secs(30)).map_err(|e| e.to_string())
                })
                .await;
            match started {
                Ok(()) => return,
                Err(e) if attempt % 5 == 0 => eprintln!("  restarting replica {i}: {e}"),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The proxy the proxy faults act on: on the cluster, the leader's.
    async fn proxy(&self) -> Option<Proxy> {
        let Some(cluster) = &self.cluster else {
            return self.proxy.clone();
        };
        let leader = match cluster.primary().await {
            Ok((_, i)) => i,
            Err(e) => {
                eprintln!("  no leader, the first node's proxy instead: {e}");
                0
            }
        };
        cluster.proxies.get(leader).cloned()
    }

    /// Inject one fault and wait until it is over (the server back, the
    /// proxy passing, the disk freed, the clock true again, the cluster
    /// healthy); whether it was injected (and recorded).
    pub async fn inject(&self, fault: Fault, replica: usize) -> bool {
        if fault.on_cluster() {
            let Some(cluster) = &self.cluster else {
                return false;
            };
            let span = cluster.inject(fault, &self.work).await;
            let injected = span.is_some();
            if let Some(span) = span {
                self.work.rec.span(span);
            }
            return injected;
        }
        let lease = Duration::from_millis(self.work.lease_ms);
        let started = self.work.rec.now_ms();
        match fault {
            Fault::Kill => {
                self.with_replica(replica, Replica::kill).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                self.restart(replica).await;
            }
            Fault::PauseServer => {
                self.with_replica(replica, |r| r.pause(true)).await;
                tokio::time::sleep(lease + Duration::from_secs(1)).await;
                self.with_replica(replica, |r| r.pause(false)).await;
            }
            Fault::PauseWorkers => {
                self.work.hold_workers.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.work.hold_workers.store(false, Ordering::SeqCst);
                tokio::time::sleep(lease + Duration::from_millis(500)).await;
            }
            Fault::TerminateBackends => {
                for _ in 0..3 {
                    if let Err(e) = self.terminate_backends().await {
                        eprintln!("  pg_terminate_backend: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
            }
            Fault::RestartPostgres => {
                let done =
                    tokio::task::spawn_blocking(|| restart_postgres().map_err(|e| e.to_string()))
                        .await;
                if let Ok(Err(e)) | Err(e) = done.map_err(|e| e.to_string()) {
                    eprintln!("  restarting PostgreSQL: {e}");
                }
            }
            Fault::ProxyDelay | Fault::ProxyStall => {
                let (mode, hold) = if fault == Fault::ProxyDelay {
                    (
                        Mode::Delay(Duration::from_millis(150)),
                        Duration::from_secs(3),
                    )
                } else {
                    (Mode::Stall, lease + Duration::from_secs(1))
                };
                if let Some(proxy) = self.proxy().await {
                    proxy.set(mode);
                    tokio::time::sleep(hold).await;
                    proxy.set(Mode::Pass);
                }
            }
            Fault::ProxyCut => {
                if let Some(proxy) = self.proxy().await {
                    for _ in 0..3 {
                        proxy.cut();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            Fault::DiskFull => {
                if let Some(disk) = &self.disk {
                    let filler = tokio::task::block_in_place(|| fill(disk));
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let _ = std::fs::remove_file(filler);
                }
            }
            Fault::Switchover
            | Fault::Failover
            | Fault::DemoteInPlace
            | Fault::IsolatePrimary
            | Fault::LoseStandby => {}
            Fault::ClockStep => {
                for step in [120, -120] {
                    self.with_replica(replica, move |r| r.step_clock(step))
                        .await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                self.with_replica(replica, |r| r.step_clock(0)).await;
                // libfaketime reads its file again within a second.
                tokio::time::sleep(Duration::from_millis(1_200)).await;
            }
        }
        self.work.rec.fault(&fault.name(), started);
        true
    }

    async fn terminate_backends(&self) -> Result<u64, sqlx::Error> {
        let (admin, database) = match (&self.cluster, &self.postgres) {
            (Some(cluster), _) => {
                let leader = cluster.primary().await.map_or(0, |(_, i)| i);
                (Cluster::admin_url(leader), cluster.database.clone())
            }
            (None, Some((admin, database))) => (admin.clone(), database.clone()),
            (None, None) => return Ok(0),
        };
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(database)
        .fetch_one(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Run the schedule until `until`: every kind alone, in turn, with a quiet
/// gap before each (so that recovery is measured against a steady rate),
/// for the first half at least once each; then faults at once on random
/// targets (several replicas, the database and the workers together), for
/// what is left of the run and at least four gaps.
///
/// With faults on a PostgreSQL cluster (which take 10-20 s each and never
/// overlap one another), the mixed part starts a cluster fault whenever none
/// runs, the kind injected least so far first, and goes on past `until`
/// until every cluster kind was injected `cluster_min` times in all.
pub async fn schedule(
    target: Arc<Target>,
    faults: Vec<Fault>,
    until: Instant,
    gap: Duration,
    seed: u64,
    cluster_min: usize,
) {
    let mut rng = Rng::new(seed);
    let replicas = target.replicas.len();
    let start = Instant::now();
    let half = start + (until - start) / 2;
    let injected: Arc<Mutex<HashMap<Fault, usize>>> = Arc::default();
    let count = |fault: Fault| {
        *injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fault)
            .unwrap_or(&0)
    };
    let mut round = 0;
    while round == 0 || Instant::now() < half {
        for &fault in &faults {
            tokio::time::sleep(gap).await;
            let replica = rng.index(replicas);
            eprintln!(
                "  {:>6.1} s  {} (replica {replica})",
                start.elapsed().as_secs_f64(),
                fault.name()
            );
            if target.inject(fault, replica).await {
                *injected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(fault)
                    .or_default() += 1;
            }
        }
        round += 1;
    }
    eprintln!("  {:>6.1} s  mixed faults", start.elapsed().as_secs_f64());
    let on_cluster: Vec<Fault> = faults.iter().copied().filter(|f| f.on_cluster()).collect();
    let others: Vec<Fault> = faults.iter().copied().filter(|f| !f.on_cluster()).collect();
    let locks: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut running = tokio::task::JoinSet::new();
    // Mixed faults for what is left, and a few rounds of them however short
    // the run; cluster faults until each kind had its share (within reason).
    let until = until.max(Instant::now() + gap * 4);
    let give_up = until + (until - start) * 2;
    loop {
        let now = Instant::now();
        let short = on_cluster.iter().any(|f| count(*f) < cluster_min);
        if now + gap >= until && !(short && now < give_up) {
            break;
        }
        tokio::time::sleep(gap / 2).await;
        // Up to three at once, never two on the same thing.
        if running.len() >= 3 {
            let _ = running.join_next().await;
            continue;
        }
        let cluster_idle = !locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains("cluster");
        let fault = if cluster_idle && !on_cluster.is_empty() {
            let least = on_cluster.iter().map(|f| count(*f)).min().unwrap_or(0);
            let due: Vec<Fault> = on_cluster
                .iter()
                .copied()
                .filter(|f| count(*f) == least)
                .collect();
            due[rng.index(due.len())]
        } else if others.is_empty() {
            continue;
        } else {
            others[rng.index(others.len())]
        };
        let replica = rng.index(replicas);
        let keys = fault.lock_keys(replica);
        {
            let mut held = locks.lock().unwrap_or_else(|p| p.into_inner());
            if keys.iter().any(|k| held.contains(k)) {
                continue;
            }
            held.extend(keys.iter().cloned());
        }
        eprintln!(
            "  {:>6.1} s  + {} (replica {replica})",
            start.elapsed().as_secs_f64(),
            fault.name()
        );
        let (target, locks, injected) = (target.clone(), locks.clone(), injected.clone());
        running.spawn(async move {
            if target.inject(fault, replica).await {
                *injected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(fault)
                    .or_default() += 1;
            }
            let mut held = locks.lock().unwrap_or_else(|p| p.into_inner());
            for key in &keys {
                held.remove(key);
            }
        });
    }
    while running.join_next().await.is_some() {}
}
